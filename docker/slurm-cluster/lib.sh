# shellcheck shell=bash
# The slurm-gpu test bed's building blocks, shared by the native launcher (local-cluster)
# and the compose entrypoint (container-entrypoint), so both paths run the same code.
#
# Everything lives under one state directory, $STATE:
#   etc/      slurm.conf gres.conf slurmdbd.conf slurm-gpu.toml (rendered from templates/)
#   run/      <daemon>.pid of every process we started (what `down` stops)
#   log/      daemon logs          spool/   slurmctld and slurmd spool dirs
#   mysql/    MariaDB datadir      dev/     nvidia0-3 character devices (major 195)
#   sim-nvml/<node>/  simulated GPUs   lib/  libnvidia-ml.so.1 (simulated NVML)
#   sim-nvml/<node>/driver/  the NVIDIA driver's procfs/sysfs entries (release beds' gpu1)
#   bin/      gpu-load, sim-gpu   jobs/  world-writable working directory for test jobs
#   node/     slurm-gpu node state (bindings, spool)
#   munge-<node>/  the node's munged (collector.sh)   pgdata/  PostgreSQL (postgres.sh)
# SLURM_GPU_BED_SHAPES=1 adds nodes gpu3 (MIG) and gpu4 (shards): shapes.sh.

CLUSTER_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$CLUSTER_SRC/../.." && pwd)
# The Slurm release (SLURM_GPU_SLURM_RELEASE): its state dir, ports and Debian root.
# shellcheck source=release-root.sh
. "$CLUSTER_SRC/release-root.sh"

STATE=${SLURM_GPU_CLUSTER_DIR:-/var/tmp/slurm-gpu-cluster}
CLUSTER=${SLURM_GPU_CLUSTER_NAME:-testbed}
CTLD_PORT=${SLURM_GPU_CTLD_PORT:-16817}
DBD_PORT=${SLURM_GPU_DBD_PORT:-16819}
DB_PORT=${SLURM_GPU_DB_PORT:-13306}
NODE1_PORT=${SLURM_GPU_NODE1_PORT:-16901}
NODE2_PORT=${SLURM_GPU_NODE2_PORT:-16902}
# In containers these are service names; natively everything is this host on loopback.
CTLD_HOST=${SLURM_GPU_CTLD_HOST:-$(hostname -s)}
CTLD_ADDR=${SLURM_GPU_CTLD_ADDR:-127.0.0.1}
DBD_HOST=${SLURM_GPU_DBD_HOST:-$(hostname -s)}
DBD_ADDR=${SLURM_GPU_DBD_ADDR:-127.0.0.1}
DB_ADDR=${SLURM_GPU_DB_ADDR:-127.0.0.1}
NODE1_HOST=${SLURM_GPU_NODE1_HOST:-localhost}
NODE1_ADDR=${SLURM_GPU_NODE1_ADDR:-127.0.0.1}
NODE2_HOST=${SLURM_GPU_NODE2_HOST:-localhost}
NODE2_ADDR=${SLURM_GPU_NODE2_ADDR:-127.0.0.1}
NODES="gpu1 gpu2"
# The shapes bed's nodes gpu3 and gpu4 (SLURM_GPU_BED_SHAPES=1); nothing without it.
# shellcheck source=shapes.sh
. "$CLUSTER_SRC/shapes.sh"
if shapes_on; then NODES="gpu1 gpu2 $SHAPE_NODES"; fi
# Test-bed-only credentials: the database listens on loopback only.
DB_SLURM_PASS=${SLURM_GPU_DB_SLURM_PASS:-slurmdb-testbed}
DB_STORE_PASS=${SLURM_GPU_DB_STORE_PASS:-slurmgpu-testbed}

SLURM_CONF="$STATE/etc/slurm.conf"
export SLURM_CONF

DEBIAN_PACKAGES="slurm-wlm slurmdbd slurm-client munge mariadb-server mariadb-client libslurm-dev gcc make libc6-dev python3 python3-venv util-linux procps postgresql iproute2"

# PostgreSQL for the store's PostgreSQL backend tests.
# shellcheck source=postgres.sh
[ -f "$CLUSTER_SRC/postgres.sh" ] && . "$CLUSTER_SRC/postgres.sh"
# The collector, the nodes' network namespaces and munged (SLURM_GPU_BED_STORE).
# shellcheck source=collector.sh
. "$CLUSTER_SRC/collector.sh"
# NATS JetStream and the ingest workers (SLURM_GPU_BED_STORE=nats).
# shellcheck source=nats.sh
. "$CLUSTER_SRC/nats.sh"
# Prometheus (scraping the agents and the exporter) and the slurm-gpu exporter.
# shellcheck source=prometheus.sh
[ -f "$CLUSTER_SRC/prometheus.sh" ] && . "$CLUSTER_SRC/prometheus.sh"

log() { printf 'local-cluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- packages ------------------------------------------------------------------------

install_packages() {
    local missing=""
    for bin in slurmctld slurmd slurmdbd munged mariadbd sacctmgr gcc make python3 ip /usr/lib/postgresql/15/bin/postgres; do
        command -v "$bin" >/dev/null 2>&1 || missing=yes
    done
    /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || missing=yes
    [ -z "$missing" ] && return 0
    [ "$(id -u)" = 0 ] || die "missing Debian packages and not root: $DEBIAN_PACKAGES"
    log "installing Debian packages: $DEBIAN_PACKAGES"
    export DEBIAN_FRONTEND=noninteractive
    # policy-rc.d keeps the packages' own services from starting: we run our own.
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    apt-get update -qq >/dev/null
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $DEBIAN_PACKAGES >/dev/null
}

# --- rendering -----------------------------------------------------------------------

# write_if_changed FILE: stdin becomes FILE only when it differs, so a second `up`
# touches nothing.
write_if_changed() {
    local file=$1 tmp
    tmp=$(mktemp "$file.XXXXXX")
    cat >"$tmp"
    if [ -f "$file" ] && cmp -s "$tmp" "$file"; then
        rm -f "$tmp"
    else
        mv -f "$tmp" "$file"
    fi
}

render() {
    local template=$1
    sed -e "s|@STATE@|$STATE|g" -e "s|@CLUSTER@|$CLUSTER|g" \
        -e "s|@CTLD_HOST@|$CTLD_HOST|g" -e "s|@CTLD_ADDR@|$CTLD_ADDR|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@DBD_HOST@|$DBD_HOST|g" \
        -e "s|@DBD_ADDR@|$DBD_ADDR|g" -e "s|@DBD_PORT@|$DBD_PORT|g" \
        -e "s|@DB_ADDR@|$DB_ADDR|g" -e "s|@DB_PORT@|$DB_PORT|g" \
        -e "s|@DB_SLURM_PASS@|$DB_SLURM_PASS|g" \
        -e "s|@NODE1_HOST@|$NODE1_HOST|g" -e "s|@NODE1_ADDR@|$NODE1_ADDR|g" \
        -e "s|@NODE1_PORT@|$NODE1_PORT|g" -e "s|@NODE2_HOST@|$NODE2_HOST|g" \
        -e "s|@NODE2_ADDR@|$NODE2_ADDR|g" -e "s|@NODE2_PORT@|$NODE2_PORT|g" \
        -e "s|@GPU_FILES@|$GPU_FILES|g" -e "s|@HOOKS@|$HOOKS|g" \
        -e "s|@GPU1_GRES@|$(release_gpu1_gres)|g" -e "s|@STORE_URL@|$(store_url)|g" \
        "$CLUSTER_SRC/templates/$template"
}

# make_gpu_devices: character devices with NVIDIA's major (195) so the agent resolves
# Slurm's GPU index through the file's minor number exactly as on hardware. Where mknod
# is not allowed (some containers) fall back to /dev/tty0-3, whose minors are also 0-3.
make_gpu_devices() {
    mkdir -p "$STATE/dev"
    local ok=yes
    for m in 0 1 2 3; do
        [ -c "$STATE/dev/nvidia$m" ] && continue
        mknod -m 666 "$STATE/dev/nvidia$m" c 195 "$m" 2>/dev/null || ok=no
    done
    if [ "$ok" = yes ]; then
        GPU_FILES="$STATE/dev/nvidia[0-3]"
    else
        log "mknod not permitted; using /dev/tty[0-3] as GPU device files"
        GPU_FILES="/dev/tty[0-3]"
    fi
}

gpu_file_list() {
    case "$GPU_FILES" in
        */nvidia\[0-3\]) for m in 0 1 2 3; do echo "$STATE/dev/nvidia$m"; done ;;
        *) for m in 0 1 2 3; do echo "/dev/tty$m"; done ;;
    esac
}

hooks_lines() {
    # The node-side hooks (hooks/: prolog, epilog and their library) are installed when
    # they exist in this checkout.
    HOOKS=""
    if [ -x "$REPO_ROOT/hooks/slurm-gpu-prolog" ] && [ -x "$REPO_ROOT/hooks/slurm-gpu-epilog" ]; then
        HOOKS="Prolog=$STATE/hooks/slurm-gpu-prolog\nEpilog=$STATE/hooks/slurm-gpu-epilog"
    fi
}

render_configs() {
    mkdir -p "$STATE"/{etc,run,log,spool/ctld,spool/dbd,mysql-run,jobs,bin,lib,node,hooks,sim-nvml}
    for n in $NODES; do mkdir -p "$STATE/spool/$n"; done
    chmod 755 "$STATE"
    # Daemons drop to their own users (slurm, mysql) and write logs here.
    chmod 1777 "$STATE/jobs" "$STATE/log"
    chown slurm:slurm "$STATE/spool/ctld" "$STATE/spool/dbd"
    chown mysql:mysql "$STATE/mysql-run"
    make_gpu_devices
    hooks_lines
    shapes_prepare
    render slurm.conf.in | sed 's/\\n/\n/g' | release_conf_lines slurm.conf | shapes_slurm_conf |
        write_if_changed "$STATE/etc/slurm.conf"
    shapes_gpu3_conf
    render gres.conf.in | shapes_gres_conf | write_if_changed "$STATE/etc/gres.conf"
    render slurmdbd.conf.in | release_conf_lines slurmdbd.conf | write_if_changed "$STATE/etc/slurmdbd.conf"
    chown slurm:slurm "$STATE/etc/slurmdbd.conf"
    chmod 600 "$STATE/etc/slurmdbd.conf"
    render slurm-gpu.toml.in | shapes_toml | collector_toml | nats_toml |
        write_if_changed "$STATE/etc/slurm-gpu.toml"
    chmod 644 "$STATE/etc/slurm.conf" "$STATE/etc/gres.conf" "$STATE/etc/slurm-gpu.toml"
    render_agent_configs
    echo "$BED_STORE" | write_if_changed "$STATE/etc/bed-store"
    mailprog_config
}

# mailprog_config: the config of slurm.conf's MailProg (hooks/slurm-gpu-mailprog, run by
# slurmctld as slurm): the test bed's, with the mails written into $STATE/mail (nowhere
# harmful). tests/integration/test_mailprog.py rewrites it for its SMTP receiver while it
# runs (the wrapper reads it at every mail) and puts this one back.
mailprog_config() {
    mkdir -p "$STATE/mail"
    chown slurm:slurm "$STATE/mail"
    { render slurm-gpu.toml.in | shapes_toml; printf '\n[mailprog]\noutbox_dir = "%s"\n' "$STATE/mail"; } |
        write_if_changed "$STATE/etc/slurm-gpu-mailprog.toml"
    chmod 644 "$STATE/etc/slurm-gpu-mailprog.toml"
}

# install_mailprog: the MailProg wrapper and its settings (read next to it, never sourced).
install_mailprog() {
    install -m 755 "$REPO_ROOT/hooks/slurm-gpu-mailprog" "$STATE/hooks/slurm-gpu-mailprog.new"
    mv -f "$STATE/hooks/slurm-gpu-mailprog.new" "$STATE/hooks/slurm-gpu-mailprog"
    # A release bed's slurmctld runs MailProg inside its Debian root (release-root.sh).
    local slurm_gpu="${VENV:-${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}}/bin/slurm-gpu"
    if [ -n "$RELEASE_SUITE" ]; then
        release_in_root_launcher
        slurm_gpu="$STATE/hooks/slurm-gpu-in-root"
    fi
    printf 'SLURM_GPU=%s\nCONFIG=%s\nLOG_FILE=%s\n' "$slurm_gpu" \
        "$STATE/etc/slurm-gpu-mailprog.toml" "$STATE/log/mailprog.log" |
        write_if_changed "$STATE/hooks/slurm-gpu-mailprog.conf"
    chmod 644 "$STATE/hooks/slurm-gpu-mailprog.conf"
}

# --- simulated GPUs and tools --------------------------------------------------------

install_sim() {
    make -s -C "$CLUSTER_SRC/sim-nvml" OUT="$STATE/lib" >/dev/null
    for tool in gpu-load sim-gpu; do
        install -m 755 "$CLUSTER_SRC/bin/$tool" "$STATE/bin/$tool.new"
        if cmp -s "$STATE/bin/$tool.new" "$STATE/bin/$tool"; then
            rm -f "$STATE/bin/$tool.new"
        else
            mv -f "$STATE/bin/$tool.new" "$STATE/bin/$tool"
        fi
    done
    chmod 1777 "$STATE/sim-nvml"
    # gpu1's NVML enumeration order differs from its minor numbers on purpose: code that
    # assumes Slurm index == NVML index attributes usage to the wrong GPU there.
    "$STATE/bin/sim-gpu" create --dir "$STATE/sim-nvml/gpu1" --node gpu1 \
        --model "NVIDIA A100-SXM4-80GB" --memory-mib 81920 --count 4 --order 2,0,3,1 >/dev/null
    "$STATE/bin/sim-gpu" create --dir "$STATE/sim-nvml/gpu2" --node gpu2 \
        --model "NVIDIA H100 80GB HBM3" --memory-mib 81559 --count 4 --order 0,1,2,3 >/dev/null
    for n in $NODES; do
        case "$n" in
            gpu1 | gpu2) gpu_file_list ;;
            *) shapes_gres_files "$n" ;;
        esac | write_if_changed "$STATE/sim-nvml/$n/slurm-gres-files"
        chmod 644 "$STATE/sim-nvml/$n/slurm-gres-files"
    done
    # gpu1's driver view for AutoDetect=nvidia (release beds: mounted in its slurmd's namespace).
    release_sim_driver gpu1
    if [ -n "$HOOKS" ]; then
        # The library first: a running slurmd never starts a new hook without it.
        install -m 644 "$REPO_ROOT/hooks/slurm-gpu-hooks.sh" "$STATE/hooks/slurm-gpu-hooks.sh"
        install -m 755 "$REPO_ROOT/hooks/slurm-gpu-prolog" "$STATE/hooks/slurm-gpu-prolog"
        install -m 755 "$REPO_ROOT/hooks/slurm-gpu-epilog" "$STATE/hooks/slurm-gpu-epilog"
        # The hooks read this file next to themselves (never sourced: they run as root).
        printf 'STATE_DIR=%s\nLOG_FILE=%s\n' "$STATE/node" "$STATE/log/hooks.log" |
            write_if_changed "$STATE/hooks/slurm-gpu-hooks.conf"
        chmod 644 "$STATE/hooks/slurm-gpu-hooks.conf"
    fi
    install_mailprog
}

# --- daemons -------------------------------------------------------------------------

pidfile() { echo "$STATE/run/$1.pid"; }

is_running() {
    local pf
    pf=$(pidfile "$1")
    [ -f "$pf" ] && kill -0 "$(cat "$pf")" 2>/dev/null
}

# spawn NAME CMD...: start a foreground daemon in its own session, remember its pid.
spawn() {
    local name=$1
    shift
    setsid "$@" >>"$STATE/log/$name.out" 2>&1 </dev/null &
    echo $! >"$(pidfile "$name")"
}

# wait_for WHAT SECONDS CMD...: poll CMD until it succeeds or the deadline passes.
wait_for() {
    local what=$1 deadline=$(($(date +%s) + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || die "timed out waiting for $what (logs: $STATE/log)"
        sleep 0.5
    done
}

start_munge() {
    # A release bed (24.11, 26.05) has its own munged (release-root.sh).
    if [ -n "$RELEASE_SUITE" ]; then
        release_start_munge
        return 0
    fi
    # The default bed uses the host's munged on /run/munge: reuse one that answers there
    # (a release bed's munged listens on its own socket and does not count).
    if is_running munge || { munge -n | unmunge; } >/dev/null 2>&1; then return 0; fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 755 /run/munge
    [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile /etc/munge/munge.key 2>/dev/null ||
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 2>/dev/null; }
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    spawn munge runuser -u munge -- /usr/sbin/munged --foreground
    wait_for munge 20 sh -c 'munge -n | unmunge'
}

# shellcheck disable=SC2120 # wait_for passes it arguments; shellcheck cannot see that call.
mysql_root() { mariadb --no-defaults --socket="$STATE/mysql-run/mysqld.sock" -uroot "$@"; }

start_mariadb() {
    is_running mariadb && return 0
    # Its own tmpdir: two beds set up at once (.ci/run's release matrix) must not share
    # /tmp's temporary tables (seen: one install failing on the other's files).
    mkdir -p "$STATE/mysql-tmp"
    chown mysql:mysql "$STATE/mysql-tmp"
    if [ ! -d "$STATE/mysql/mysql" ]; then
        mkdir -p "$STATE/mysql"
        chown mysql:mysql "$STATE/mysql"
        mariadb-install-db --no-defaults --datadir="$STATE/mysql" --user=mysql \
            --tmpdir="$STATE/mysql-tmp" \
            --auth-root-authentication-method=socket >"$STATE/log/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed: $STATE/log/mariadb-install.log"
    fi
    spawn mariadb /usr/sbin/mariadbd --no-defaults --datadir="$STATE/mysql" --user=mysql \
        --tmpdir="$STATE/mysql-tmp" \
        --socket="$STATE/mysql-run/mysqld.sock" --port="$DB_PORT" --bind-address="$DB_ADDR" \
        --pid-file="$STATE/mysql-run/mariadbd.pid" --log-error="$STATE/log/mariadb.log" \
        --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900
    wait_for mariadb 60 mysql_root -e 'SELECT 1'
    # slurm_acct_db for slurmdbd; slurm_gpu for slurm-gpu's own store on MariaDB.
    mysql_root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE DATABASE IF NOT EXISTS slurm_gpu;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_SLURM_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_SLURM_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
CREATE USER IF NOT EXISTS 'slurmgpu'@'127.0.0.1' IDENTIFIED BY '$DB_STORE_PASS';
GRANT ALL ON slurm_gpu.* TO 'slurmgpu'@'127.0.0.1';
GRANT ALL ON \`slurm_gpu_test%\`.* TO 'slurmgpu'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL
}

start_slurmdbd() {
    is_running slurmdbd && return 0
    in_root
    spawn slurmdbd "${IN_ROOT[@]}" env SLURM_CONF="$SLURM_CONF" /usr/sbin/slurmdbd -D
    wait_for slurmdbd 60 sacctmgr -n show cluster
}

start_slurmctld() {
    is_running slurmctld && return 0
    # -i: ignore state files from an older test bed rather than refusing to start.
    in_root
    spawn slurmctld "${IN_ROOT[@]}" /usr/sbin/slurmctld -D -i -f "$SLURM_CONF"
    wait_for slurmctld 60 scontrol ping
    if is_running slurmd-gpu1 || is_running slurmd-gpu2; then
        # A restart under running jobs: Slurm 22.05 can keep GRES of jobs that ended
        # meanwhile counted as allocated (seen here: a node IDLE with AllocTRES=gres/gpu=2,
        # so jobs stay pending). A reconfigure rebuilds the allocations from the jobs.
        scontrol reconfigure >/dev/null 2>&1 || true
    fi
}

start_slurmd() {
    local node=$1
    is_running "slurmd-$node" && return 0
    in_root "$node"
    spawn "slurmd-$node" "${IN_ROOT[@]}" /usr/sbin/slurmd -D -f "$(shapes_slurmd_conf "$node")" -N "$node"
}

wait_nodes_idle() {
    # shellcheck disable=SC2016 # the inner sh expands it, on every try.
    wait_for "nodes gpu1,gpu2 idle" 90 sh -c \
        '[ "$(sinfo -h -N -p gpu -t idle,mix,alloc -o %N | sort -u | wc -l)" -ge 2 ]'
    if shapes_on; then
        # shellcheck disable=SC2016 # the inner sh expands it, on every try.
        wait_for "nodes gpu3,gpu4 idle" 90 sh -c \
            '[ "$(sinfo -h -N -p shapes -t idle,mix,alloc -o %N | sort -u | wc -l)" -ge 2 ]'
    fi
}

bootstrap_accounts() {
    # Real Unix users: jobs run under their uid, and privacy checks use it.
    for u in alice bob carol; do
        id "$u" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$u"
    done
    sacctmgr -n -P show cluster format=Cluster | grep -qx "$CLUSTER" ||
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    local have
    have=$(sacctmgr -n -P show assoc format=Account,User cluster="$CLUSTER")
    for a in physics bio; do
        echo "$have" | grep -q "^$a|$" ||
            sacctmgr -i add account "$a" cluster="$CLUSTER" Description="$a" Organization=science >/dev/null
    done
    add_assoc() { echo "$have" | grep -qx "$2|$1" || sacctmgr -i add user "$1" account="$2" cluster="$CLUSTER" >/dev/null; }
    add_assoc alice physics
    add_assoc bob bio
    add_assoc carol physics
    add_assoc carol bio
    # Account coordinators (the monthly statements go to them): dana of physics, erin of
    # bio. Slurm users without jobs, so that alice, bob and carol see only their own jobs.
    add_assoc dana physics
    add_assoc erin bio
    local coords
    coords=$(sacctmgr -n -P show account withcoord format=Account,Coordinators)
    add_coord() { echo "$coords" | grep -q "^$1|.*\b$2\b" || sacctmgr -i add coordinator account="$1" names="$2" >/dev/null; }
    add_coord physics dana
    add_coord bio erin
    bootstrap_preempt_qos
}

bootstrap_preempt_qos() {
    # Preemption by QOS (slurm.conf.in: PreemptType=preempt/qos): a low QOS per
    # PreemptMode, and urgent, which alone preempts them (qos.html, sacctmgr(1) Preempt,
    # PreemptMode). normal, every association's default QOS, is in no Preempt list.
    local qos
    qos=$(sacctmgr -n -P show qos format=Name)
    local mode
    for mode in requeue cancel suspend; do
        echo "$qos" | grep -qx "preempt-$mode" ||
            sacctmgr -i add qos "preempt-$mode" PreemptMode="$mode" Priority=0 >/dev/null
    done
    echo "$qos" | grep -qx urgent ||
        sacctmgr -i add qos urgent Priority=1000 \
            Preempt=preempt-requeue,preempt-cancel,preempt-suspend >/dev/null
    # Every user may ask for them (AccountingStorageEnforce=qos); the default stays normal.
    local want=normal,preempt-requeue,preempt-cancel,preempt-suspend,urgent
    sacctmgr -n -P show assoc cluster="$CLUSTER" format=User,QOS | grep -q '^alice|.*urgent' ||
        sacctmgr -i modify user where name=alice,bob,carol cluster="$CLUSTER" \
            set QOS="$want" DefaultQOS=normal >/dev/null
}

cluster_is_up() {
    for d in mariadb postgres slurmdbd slurmctld; do
        is_running "$d" || return 1
    done
    for n in $NODES; do
        is_running "slurmd-$n" || return 1
    done
    scontrol ping >/dev/null 2>&1
}

stop_all() {
    local stopped=""
    # Compute nodes first, the database last; munge only if we started it.
    # gpu3 and gpu4 (the shapes bed) whether or not SLURM_GPU_BED_SHAPES is set now.
    for d in prometheus slurm-gpu-exporter slurm-gpu-agent-gpu1 slurm-gpu-agent-gpu2 \
        slurm-gpu-agent-gpu3 slurm-gpu-agent-gpu4 slurm-gpu-collector slurm-gpu-ingest-1 \
        slurm-gpu-ingest-2 slurm-gpu-ingest-3 nats-server munge-gpu1 munge-gpu2 \
        munge-gpu3 munge-gpu4 slurmd-gpu1 slurmd-gpu2 slurmd-gpu3 \
        slurmd-gpu4 slurmctld slurmdbd postgres mariadb munge; do
        local pf
        pf=$(pidfile "$d")
        [ -f "$pf" ] || continue
        # postgres: a fast shutdown; SIGTERM would wait for pooled clients to leave.
        [ "$d" = postgres ] && type stop_postgres >/dev/null 2>&1 && stop_postgres
        [ -f "$pf" ] || { stopped="$stopped $d"; continue; }
        local pid
        pid=$(cat "$pf")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
            stopped="$stopped $d"
        fi
        rm -f "$pf"
    done
    # The nodes' namespaces and links (collector.sh), whatever SLURM_GPU_BED_STORE is now.
    net_down
    log "stopped:${stopped:- nothing was running}"
}
