# shellcheck shell=bash
# The bed's nodes ship through the collector (issue 16, docs/design/collector.md): the
# layout of a cluster, on one machine.
#
#   store       the bed's PostgreSQL (postgres.sh); only `slurm-gpu collector run` and
#               the head node's tools (exporter, controller, reports, MailProg: etc/
#               slurm-gpu.toml) hold its URL. The hooks write the node spool, as on a node.
#   collector   `slurm-gpu collector run` on the head node's address HEAD_ADDR:COLLECTOR_PORT
#               (never 0.0.0.0), pid run/slurm-gpu-collector.pid, log log/slurm-gpu-collector.out;
#               [collector] nodes = each node's address, so the origin check is real.
#   network     a bridge sg<tag>br holding HEAD_ADDR (BED_NET.1/24); per node a network
#               namespace sgpu-<tag>-<node> joined to it by a veth (host side sg<tag><node>,
#               eth0 inside) with the node's address BED_NET.(10+N). The node's agent runs in
#               its namespace: `local-cluster link NODE down` cuts it off from the head node.
#   identity    per node a munged with the bed's key, its own socket munge-<node>/ and
#               --origin=<the node's address> ([node] munge_socket in etc/slurm-gpu-agent-
#               <node>.toml, which holds no store URL): a credential says which node made it.
# <tag> is the bed's slurmctld port, BED_NET 10.(port/256).(port%256) and COLLECTOR_PORT the
# slurmctld port + 13 (16830 on the default bed): beds on other ports (release beds, the
# shapes and lifecycle tests' beds) never share a name, an address or a port.
#
# gpu4 (the shapes bed's shard node) keeps its agent in the host's network namespace: the
# agent asks `scontrol -d show job` there, and slurmctld answers on the host's loopback,
# which a node namespace has not. Its munged still claims gpu4's own address.
# Inside a node's namespace 127.0.0.1 is its own loopback, so that agent's /metrics is on
# the node's address (agent_metrics_host), which Prometheus and the tests scrape.
#
# SLURM_GPU_BED_STORE=sqlite: the embedded default instead (SQLite store, agents write it
# directly, host network, no collector): the demo and README's first command.
#
# Sourced by lib.sh, which defines STATE, NODES, CTLD_PORT, RELEASE_SUITE, VENV (or
# SLURM_GPU_VENV), log, die, spawn, wait_for, is_running, pidfile and write_if_changed.

BED_STORE=${SLURM_GPU_BED_STORE:-collector}
case "$BED_STORE" in
    collector | sqlite | nats) ;;
    *)
        printf 'local-cluster: error: SLURM_GPU_BED_STORE=%s is not collector, nats or sqlite\n' "$BED_STORE" >&2
        exit 2
        ;;
esac
BED_TAG=${SLURM_GPU_BED_TAG:-$CTLD_PORT}
BED_NET=${SLURM_GPU_BED_NET:-10.$((CTLD_PORT / 256)).$((CTLD_PORT % 256))}
HEAD_ADDR=$BED_NET.1
COLLECTOR_PORT=${SLURM_GPU_COLLECTOR_PORT:-$((CTLD_PORT + 13))}
COLLECTOR_URL="http://$HEAD_ADDR:$COLLECTOR_PORT"

collector_on() { [ "$BED_STORE" = collector ]; }
# nodes_remote: the agents hold no store URL and ship to the head node (collector or NATS,
# nats.sh), each in a network namespace of its own, the store PostgreSQL.
nodes_remote() { [ "$BED_STORE" != sqlite ]; }

node_addr() { echo "$BED_NET.$((10 + ${1#gpu}))"; }
node_netns() { echo "sgpu-$BED_TAG-$1"; }
node_veth() { echo "sg$BED_TAG$1"; }
bed_bridge() { echo "sg${BED_TAG}br"; }
node_munge_socket() { echo "$STATE/munge-$1/munge.socket.2"; }

# agent_in_netns NODE: whether NODE's agent runs in its own network namespace.
agent_in_netns() { nodes_remote && [ "$1" != gpu4 ]; }

# agent_metrics_host NODE: the address NODE's agent serves /metrics on.
agent_metrics_host() {
    if agent_in_netns "$1"; then node_addr "$1"; else echo 127.0.0.1; fi
}

# agent_config NODE: the config NODE's agent runs on (SLURM_GPU_AGENT_CONFIG wins).
agent_config() {
    if [ -n "${SLURM_GPU_AGENT_CONFIG:-}" ]; then
        echo "$SLURM_GPU_AGENT_CONFIG"
    elif nodes_remote; then
        echo "$STATE/etc/slurm-gpu-agent-$1.toml"
    else
        echo "$STATE/etc/slurm-gpu.toml"
    fi
}

# store_url: [store] url of the bed's slurm-gpu.toml.
store_url() {
    if nodes_remote; then
        echo "postgresql+psycopg://slurmgpu:$DB_STORE_PASS@127.0.0.1:$PG_PORT/slurm_gpu"
    else
        echo "sqlite:///$STATE/accounting.db"
    fi
}

# collector_toml: stdin (slurm-gpu.toml) plus its [collector] section, when on.
collector_toml() {
    cat
    collector_on || return 0
    local n listed=""
    for n in $NODES; do listed="$listed${listed:+, }$n = [\"$(node_addr "$n")\"]"; done
    printf '\n[collector]\n# The bed'"'"'s collector (docker/slurm-cluster/collector.sh).\n'
    printf 'listen = "%s:%s"\n' "$HEAD_ADDR" "$COLLECTOR_PORT"
    # The bed's own munged decodes (a release bed's on its socket; the host's otherwise).
    if [ -n "$RELEASE_SUITE" ]; then printf 'munge_socket = "%s"\n' "$STATE/munge/munge.socket.2"; fi
    printf 'nodes = { %s }\n' "$listed"
}

# agent_toml NODE: stdin (slurm-gpu.toml before collector_toml) as NODE's agent config:
# no store URL, shipping to the collector, signing with the node's own munged (or, in
# the NATS layout, publishing with the node's own key: nats.sh).
agent_toml() {
    local extra
    extra="ship_to = \"collector\"\ncollector_url = \"$COLLECTOR_URL\"\nmunge_socket = \"$(node_munge_socket "$1")\""
    if nats_on; then extra="ship_to = \"nats\""; fi
    local slurm_conf=""
    # In its network namespace the head is $HEAD_ADDR, not loopback: the agent's squeue and
    # scontrol (job_check_interval, shares) read slurm-netns.conf.
    if agent_in_netns "$1"; then slurm_conf="$STATE/etc/slurm-netns.conf"; fi
    # The AdminComment is the collector's to write: an agent reads no store.
    awk -v extra="$extra" -v slurm_conf="$slurm_conf" '/^url = / { next }
        /^write_admin_comment = / { print "write_admin_comment = false"; next }
        /^conf = / && slurm_conf != "" { print "conf = \"" slurm_conf "\""; next }
        { print } /^\[node\]$/ { print extra }'
}

# agent_slurm_conf NODE: the slurm.conf NODE's agent runs Slurm's commands with.
agent_slurm_conf() {
    # shellcheck disable=SC2153 # lib.sh sets SLURM_CONF
    if agent_in_netns "$1"; then echo "$STATE/etc/slurm-netns.conf"; else echo "$SLURM_CONF"; fi
}

# render_agent_configs: etc/slurm-gpu-agent-<node>.toml (collector or NATS on).
render_agent_configs() {
    nodes_remote || return 0
    local n
    # slurm.conf as a namespaced node sees the head: slurmctld and slurmdbd listen on every
    # address.
    sed -e "s|^SlurmctldHost=\(.*\)($CTLD_ADDR)\$|SlurmctldHost=\1($HEAD_ADDR)|" \
        -e "s|^AccountingStorageHost=$DBD_ADDR\$|AccountingStorageHost=$HEAD_ADDR|" "$STATE/etc/slurm.conf" |
        write_if_changed "$STATE/etc/slurm-netns.conf"
    chmod 644 "$STATE/etc/slurm-netns.conf"
    for n in $NODES; do
        render slurm-gpu.toml.in | shapes_toml | agent_toml "$n" | nats_toml |
            nats_agent_credentials "$n" | write_if_changed "$STATE/etc/slurm-gpu-agent-$n.toml"
        chmod 644 "$STATE/etc/slurm-gpu-agent-$n.toml"
    done
}

# --- network -------------------------------------------------------------------------

# net_up: the bridge and every namespaced node's namespace and veth. A veth that exists is
# left as it is: a link taken down (`link NODE down`) stays down through `up`.
net_up() {
    nodes_remote || return 0
    local br n ns veth
    br=$(bed_bridge)
    ip link show "$br" >/dev/null 2>&1 || ip link add "$br" type bridge || die "cannot create bridge $br"
    ip addr replace "$HEAD_ADDR/24" dev "$br"
    ip link set "$br" up
    # Which names this state dir's network has: `down` removes those, whatever ports its
    # caller's environment says (a `down` given only SLURM_GPU_CLUSTER_DIR once removed
    # the default bed's namespaces).
    echo "$BED_TAG" >"$STATE/net-tag"
    for n in $NODES; do
        agent_in_netns "$n" || continue
        ns=$(node_netns "$n")
        veth=$(node_veth "$n")
        [ -e "/run/netns/$ns" ] || ip netns add "$ns" || die "cannot create network namespace $ns"
        if ! ip link show "$veth" >/dev/null 2>&1; then
            ip -n "$ns" link del eth0 2>/dev/null || true
            ip link add "$veth" type veth peer name eth0 netns "$ns"
            ip link set "$veth" master "$br" up
        fi
        ip -n "$ns" addr replace "$(node_addr "$n")/24" dev eth0
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
    done
}

# net_down: every namespace, veth and bridge of this bed (its veth pairs go with them),
# the shapes bed's nodes whether or not SLURM_GPU_BED_SHAPES is set now.
net_down() {
    local n BED_TAG=$BED_TAG
    if [ -s "$STATE/net-tag" ]; then BED_TAG=$(cat "$STATE/net-tag"); fi
    for n in gpu1 gpu2 gpu3 gpu4; do
        [ -e "/run/netns/$(node_netns "$n")" ] && ip netns del "$(node_netns "$n")"
        ip link del "$(node_veth "$n")" 2>/dev/null || true
    done
    ip link del "$(bed_bridge)" 2>/dev/null || true
    rm -f "$STATE/net-tag"
}

# link_set NODE up|down: NODE's link to the head node (its veth's host side).
link_set() {
    agent_in_netns "$1" || die "link: $1 has no link of its own (SLURM_GPU_BED_STORE=sqlite, or gpu4)"
    ip link set "$(node_veth "$1")" "$2"
}

# --- node identities and the collector ------------------------------------------------

bed_munge_key() {
    if [ -n "$RELEASE_SUITE" ]; then echo "$STATE/munge/munge.key"; else echo /etc/munge/munge.key; fi
}

# start_node_munge NODE: NODE's munged (the bed's key, its own socket, NODE's address).
start_node_munge() {
    local n=$1 d
    collector_on || return 0
    is_running "munge-$n" && return 0
    d=$STATE/munge-$n
    mkdir -p "$d"
    chown munge:munge "$d"
    chmod 755 "$d"
    spawn "munge-$n" runuser -u munge -- /usr/sbin/munged --foreground --force \
        --socket="$d/munge.socket.2" --key-file="$(bed_munge_key)" --origin="$(node_addr "$n")" \
        --log-file="$d/munged.log" --pid-file="$d/munged.pid" --seed-file="$d/munged.seed"
    # shellcheck disable=SC2016 # the inner sh expands it, on every try.
    wait_for "munged of $n ($d)" 20 sh -c 'munge -n -S "$1" | unmunge -S "$1"' sh "$d/munge.socket.2"
}

# start_collector: `slurm-gpu collector run` on the bed's config (SLURM_GPU_COLLECTOR_CONFIG:
# another, e.g. a soak's own store).
start_collector() {
    collector_on || return 0
    is_running slurm-gpu-collector && return 0
    local venv=${VENV:-${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}}
    spawn slurm-gpu-collector env ${SLURM_GPU_PYTHONPATH:+PYTHONPATH="$SLURM_GPU_PYTHONPATH"} \
        SLURM_GPU_CONFIG="${SLURM_GPU_COLLECTOR_CONFIG:-$STATE/etc/slurm-gpu.toml}" \
        SLURM_CONF="$SLURM_CONF" "$venv/bin/slurm-gpu" collector run
    # /metrics, not /healthz: it serves (and answers 503) while the store is down.
    wait_for slurm-gpu-collector 30 http_ok "$COLLECTOR_URL/metrics"
}

stop_collector() {
    local pf
    pf=$(pidfile slurm-gpu-collector)
    [ -f "$pf" ] || return 0
    kill -TERM "$(cat "$pf")" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$(cat "$pf")" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$(cat "$pf")" 2>/dev/null || true
    rm -f "$pf"
}

# collector_env_lines: `local-cluster env` lines of this layout.
collector_env_lines() {
    local n addrs=""
    echo "export SLURM_GPU_BED_STORE='$BED_STORE'"
    nodes_remote || return 0
    for n in $NODES; do addrs="$addrs${addrs:+ }$n=$(agent_metrics_host "$n")"; done
    if collector_on; then echo "export SLURM_GPU_COLLECTOR_URL='$COLLECTOR_URL'"; fi
    echo "export SLURM_GPU_AGENT_HOSTS='$addrs'"
    nats_env_lines
}
