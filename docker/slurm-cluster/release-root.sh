# shellcheck shell=bash
# The Slurm release of the test bed: 22.05 from this host's Debian 12 packages, or 24.11
# (Debian 13, trixie) / 26.05 (Debian unstable, sid) from a Debian root under the state dir.
#
# Sourced by lib.sh before it reads its settings: the release picks the defaults of the
# state directory and of every port, so a 24.11 bed runs beside the default one.
#   release  state dir                          ctld/dbd     db     nodes        pg     metrics    prometheus
#   22.05    /var/tmp/slurm-gpu-cluster         16817/16819  13306  16901/16902  15432  19900-19902  19090
#   24.11    /var/tmp/slurm-gpu-cluster-24.11   18817/18819  15306  18901/18902  17432  21900-21902  21090
#   26.05    /var/tmp/slurm-gpu-cluster-26.05   20817/20819  16306  20901/20902  18432  22900-22902  22090
# The collector and the nodes' network follow the slurmctld port (collector.sh): 22.05's
# collector on 10.65.177.1:16830, 24.11's on 10.73.129.1:18830, 26.05's on 10.81.81.1:20830.
# Every SLURM_GPU_* variable set by the caller still wins.
#
# A release root ($STATE/root) is made by debootstrap from Debian's mirror with
# RELEASE_PACKAGES, once: root/.slurm-gpu-packages holds the suite and package list it was
# built with, and a root whose stamp differs is rebuilt. Inside it run slurmdbd, slurmctld
# and the two slurmd: each in its own private mount namespace (unshare -m) with /proc, /sys
# and /dev bound in, a tmpfs /run with the bed's own munge directory as /run/munge, and
# $STATE bound at the same path, so the hooks, the simulated GPUs' device files and state,
# the job directory and the logs are where the host sees them. The root shares the host's
# pid namespace: daemons are stopped by pid only (lib.sh's stop_all).
#
# AutoDetect: gpu1's gres.conf line here is `AutoDetect=nvidia` (no File=; 26.05 adds
# Flags=env_uuid), so slurmd's gpu/nvidia plugin reads the driver's procfs and sysfs.
# slurmd-gpu1's namespace (alone; its jobs inherit it) gets `sim-gpu procfs`'s tree as
# /proc/driver/nvidia/gpus and /sys/bus/pci/drivers/nvidia, and a tmpfs /dev of its own
# with the usual nodes and nvidia0-3 bound from $STATE/dev (the host's /dev is untouched).
# gpu2 keeps File= lines, as does every node on 22.05 (Debian's build has no gpu/nvidia).
#
# Munge: each release bed runs its own munged (the host's binary) on its own socket and
# key, $STATE/munge/munge.socket.2, started by `up` and stopped by its `down`, so a bed
# never depends on another bed's munged (or on one serving the host's /run/munge). Every
# Slurm client reaches it through slurm.conf: AuthInfo=socket= (slurmctld, slurmd, and
# the commands: squeue, scontrol, sbatch...) and AccountingStoragePass= (the munge socket
# of the connections to slurmdbd: sacctmgr and sacct use that one, not AuthInfo), and
# slurmdbd through slurmdbd.conf's AuthInfo. A client that still used the default socket
# would reach no munged or another key, and fail: nothing works by accident.
#
# MailProg: slurmctld runs it inside the root, where slurm-gpu's venv and the host's
# Python do not exist. The daemons' namespaces therefore also get, at the same paths and
# read-only, the venv, the host's python3.X binary and standard library, and the checkout
# the editable install points at (release_host_paths); the MailProg wrapper's SLURM_GPU is
# $STATE/hooks/slurm-gpu-in-root, which runs slurm-gpu on that interpreter with the venv's
# site-packages (the venv's own python is a symlink to /usr/bin/python3, which inside the
# root is the root's Python).
#
# MariaDB, PostgreSQL and Prometheus stay the host's (one instance per bed, on the bed's
# ports): slurmdbd reaches MariaDB over TCP, and a database server does not change with
# the Slurm release. slurm-gpu (agents, exporter, CLI) runs on the host too and calls
# Slurm's commands through $STATE/slurm-bin: one wrapper per client command that runs the
# root's binary with the root's dynamic loader and libraries (no chroot, so any user may
# run it, as the tests' runuser does). The same paths are valid inside the root (through
# the $STATE bind), so a job may call them too. slurm.conf's PluginDir names the root's
# plugin directory by that same path.

SLURM_RELEASE=${SLURM_GPU_SLURM_RELEASE:-22.05}
RELEASE_SUITE=""
case "$SLURM_RELEASE" in
    22.05) ;;
    24.11) RELEASE_SUITE=trixie ;;
    26.05) RELEASE_SUITE=sid ;;
    *)
        printf 'local-cluster: error: Slurm release %s is not one of 22.05, 24.11, 26.05\n' "$SLURM_RELEASE" >&2
        exit 2
        ;;
esac
export SLURM_GPU_SLURM_RELEASE=$SLURM_RELEASE
RELEASE_MIRROR=${SLURM_GPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3: the test workload (gpu-load) runs inside jobs, so inside the root.
RELEASE_PACKAGES="slurmd slurmctld slurmdbd slurm-client munge python3"

if [ -n "$RELEASE_SUITE" ]; then
    _release_defaults() {
        # NAME VALUE: a default for SLURM_GPU_NAME unless the caller set it.
        local var="SLURM_GPU_$1"
        [ -n "${!var:-}" ] || export "$var=$2"
    }
    case "$SLURM_RELEASE" in
        24.11) _p=(18817 18819 15306 18901 18902 17432 21900 21090) ;;
        26.05) _p=(20817 20819 16306 20901 20902 18432 22900 22090) ;;
    esac
    _release_defaults CLUSTER_DIR "/var/tmp/slurm-gpu-cluster-$SLURM_RELEASE"
    _release_defaults CTLD_PORT "${_p[0]}"
    _release_defaults DBD_PORT "${_p[1]}"
    _release_defaults DB_PORT "${_p[2]}"
    _release_defaults NODE1_PORT "${_p[3]}"
    _release_defaults NODE2_PORT "${_p[4]}"
    _release_defaults PG_PORT "${_p[5]}"
    _release_defaults METRICS_PORT_BASE "${_p[6]}"
    _release_defaults PROM_PORT "${_p[7]}"
    unset _p
    RELEASE_ROOT="${SLURM_GPU_CLUSTER_DIR}/root"
    # The wrappers first: the launcher's own sinfo/scontrol/sacctmgr, and everything it
    # spawns (agents, exporter), talk to this release.
    PATH="$SLURM_GPU_CLUSTER_DIR/slurm-bin:$PATH"
    export PATH
fi

# release_env_lines: extra `local-cluster env` lines for this release.
release_env_lines() {
    echo "export SLURM_GPU_SLURM_RELEASE='$SLURM_RELEASE'"
    [ -n "$RELEASE_SUITE" ] || return 0
    local v
    for v in CTLD_PORT DBD_PORT DB_PORT NODE1_PORT NODE2_PORT PG_PORT METRICS_PORT_BASE PROM_PORT; do
        v="SLURM_GPU_$v"
        echo "export $v='${!v}'"
    done
    # shellcheck disable=SC2016 # expanded by the shell that evaluates these lines.
    echo "export PATH='$STATE/slurm-bin'\${PATH:+:\$PATH}"
}

# release_conf_lines FILE: stdin plus the lines this release needs in slurm.conf or
# slurmdbd.conf (FILE names which).
release_conf_lines() {
    cat
    [ -n "$RELEASE_SUITE" ] || return 0
    echo "# Slurm $SLURM_RELEASE from $RELEASE_ROOT (docker/slurm-cluster/release-root.sh)."
    echo "AuthInfo=socket=$STATE/munge/munge.socket.2"
    if [ "$1" = slurm.conf ]; then
        echo "PluginDir=$RELEASE_ROOT/usr/lib/x86_64-linux-gnu/slurm-wlm"
        # The munge socket of connections to slurmdbd (sacctmgr, sacct, slurmctld).
        echo "AccountingStoragePass=$STATE/munge/munge.socket.2"
    fi
}

# release_start_munge: this bed's own munged on $STATE/munge/munge.socket.2 with its own
# key (a client on another munged fails to authenticate instead of working by accident).
release_start_munge() {
    local d="$STATE/munge"
    is_running munge && return 0
    mkdir -p "$d"
    chown munge:munge "$d"
    chmod 755 "$d"
    [ -s "$d/munge.key" ] || dd if=/dev/urandom of="$d/munge.key" bs=1 count=128 2>/dev/null
    chown munge:munge "$d/munge.key"
    chmod 400 "$d/munge.key"
    spawn munge runuser -u munge -- /usr/sbin/munged --foreground --force \
        --socket="$d/munge.socket.2" --key-file="$d/munge.key" --log-file="$d/munged.log" \
        --pid-file="$d/munged.pid" --seed-file="$d/munged.seed"
    # shellcheck disable=SC2016 # the inner sh expands it, on every try.
    wait_for "munged ($d)" 20 sh -c 'munge -n -S "$1" | unmunge -S "$1"' sh "$d/munge.socket.2"
}

# release_host_paths: the host paths slurm-gpu needs inside the root (MailProg), one a
# line: the venv, its Python's binary and standard library, and the directory of the
# slurm_gpu package when it lies outside the venv (an editable install's checkout).
release_host_paths() {
    local venv=${VENV:-${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}}
    [ -x "$venv/bin/python3" ] || return 0
    echo "$venv"
    # -I: not a slurm_gpu in the current directory: the one the venv imports.
    "$venv/bin/python3" -I -c 'import os, sys, sysconfig
print(os.path.realpath(sys.executable))
print(sysconfig.get_path("stdlib"))
import slurm_gpu
pkg = os.path.dirname(os.path.dirname(os.path.abspath(slurm_gpu.__file__)))
if not pkg.startswith(sys.prefix + os.sep):
    print(pkg)'
}

# release_in_root_launcher: $STATE/hooks/slurm-gpu-in-root, slurm-gpu for a process of
# the root (the MailProg wrapper's SLURM_GPU): the host's interpreter (bound in), no site
# of its own, the venv's site-packages (with the editable install's finder).
release_in_root_launcher() {
    local venv=${VENV:-${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}} py site
    py=$("$venv/bin/python3" -I -c 'import os, sys; print(os.path.realpath(sys.executable))')
    site=$("$venv/bin/python3" -I -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    write_if_changed "$STATE/hooks/slurm-gpu-in-root" <<LAUNCHER
#!/bin/sh
# slurm-gpu inside the Debian root of Slurm $SLURM_RELEASE (docker/slurm-cluster/release-root.sh):
# the host's $py and $venv are bound into the daemons' namespaces.
exec $py -I -S -c 'import site, sys
site.addsitedir("$site")
sys.argv[0] = "slurm-gpu"
from slurm_gpu.cli.main import cli
sys.exit(cli())' "\$@"
LAUNCHER
    chmod 755 "$STATE/hooks/slurm-gpu-in-root"
}

# render_release_configs: cgroup.conf for the root's slurmd. This host mounts cgroup v1
# controllers under a tmpfs /sys/fs/cgroup, which slurmd 24.11+ refuses ("cgroup
# filesystem not mounted") unless the cgroup plugin is disabled; 22.05 needs no cgroup.conf.
render_release_configs() {
    [ -n "$RELEASE_SUITE" ] || return 0
    printf '# cgroup.conf for Slurm %s on the test bed (release-root.sh).\nCgroupPlugin=disabled\n' \
        "$SLURM_RELEASE" | write_if_changed "$STATE/etc/cgroup.conf"
    chmod 644 "$STATE/etc/cgroup.conf"
}

release_stamp() { printf 'suite=%s\nmirror=%s\npackages=%s\n' "$RELEASE_SUITE" "$RELEASE_MIRROR" "$RELEASE_PACKAGES"; }

# build_release_root: $STATE/root with this release's packages, unless it is there already
# with the same suite and package list.
# install_debootstrap: scripts/install-deps installs it; this is for a bed brought up
# without it. The release beds of .ci/run come up side by side: one apt-get at a time
# (a second one fails at once on dpkg's lock), and the one that waited finds it there.
install_debootstrap() {
    local lock=/var/lock/slurm-gpu-apt.lock
    (
        flock 8
        command -v debootstrap >/dev/null 2>&1 && exit 0
        log "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null ||
            { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
    ) 8>"$lock" || die "cannot install debootstrap"
}

build_release_root() {
    [ -n "$RELEASE_SUITE" ] || return 0
    if [ -f "$RELEASE_ROOT/.slurm-gpu-packages" ] &&
        [ "$(cat "$RELEASE_ROOT/.slurm-gpu-packages")" = "$(release_stamp)" ]; then
        release_sync_root
        return 0
    fi
    command -v debootstrap >/dev/null 2>&1 || install_debootstrap
    local build="$STATE/root.build" started
    started=$(date +%s)
    log "building a Debian $RELEASE_SUITE root for Slurm $SLURM_RELEASE in $RELEASE_ROOT (once; log: $STATE/log/debootstrap.log)"
    rm -rf "$build"
    mkdir -p "$STATE/log"
    debootstrap --variant=minbase --include="${RELEASE_PACKAGES// /,}" "$RELEASE_SUITE" "$build" \
        "$RELEASE_MIRROR" >"$STATE/log/debootstrap.log" 2>&1 ||
        die "debootstrap $RELEASE_SUITE failed: $STATE/log/debootstrap.log"
    chroot "$build" /usr/sbin/slurmctld -V >>"$STATE/log/debootstrap.log" 2>&1 ||
        die "the $RELEASE_SUITE root has no working slurmctld: $STATE/log/debootstrap.log"
    # The packages' apt caches are not needed to run the daemons.
    rm -rf "$build/var/cache/apt/archives/"*.deb
    release_stamp >"$build/.slurm-gpu-packages"
    rm -rf "$RELEASE_ROOT"
    mv "$build" "$RELEASE_ROOT"
    release_sync_root
    log "root built in $(($(date +%s) - started)) s: $(chroot "$RELEASE_ROOT" /usr/sbin/slurmctld -V)"
}

# release_sync_root: the host's users (alice, bob, carol, slurm, munge, ...) with the same
# uids inside the root, the host's /etc/hosts, and the client wrappers. Every `up`.
release_sync_root() {
    local r=$RELEASE_ROOT f name
    # A user the root's packages made (munge) may have another uid there than here: its
    # files move to the host's uid, and the root's passwd/group become the host's plus the
    # root's own names the host lacks.
    for name in munge slurm; do
        local ru hu rg hg
        ru=$(awk -F: -v n="$name" '$1 == n {print $3}' "$r/etc/passwd")
        hu=$(id -u "$name" 2>/dev/null || true)
        rg=$(awk -F: -v n="$name" '$1 == n {print $3}' "$r/etc/group")
        hg=$(getent group "$name" | cut -d: -f3)
        if [ -n "$ru" ] && [ -n "$hu" ] && [ "$ru" != "$hu" ]; then
            find "$r" -xdev -uid "$ru" -exec chown -h "$hu" {} + 2>/dev/null || true
        fi
        if [ -n "$rg" ] && [ -n "$hg" ] && [ "$rg" != "$hg" ]; then
            find "$r" -xdev -gid "$rg" -exec chgrp -h "$hg" {} + 2>/dev/null || true
        fi
    done
    for f in passwd group; do
        [ -f "$r/etc/$f.slurm-gpu-orig" ] || cp -p "$r/etc/$f" "$r/etc/$f.slurm-gpu-orig"
        {
            cat "/etc/$f"
            awk -F: 'NR == FNR {seen[$1] = 1; ids[$3] = 1; next} !($1 in seen) && !($3 in ids)' \
                "/etc/$f" "$r/etc/$f.slurm-gpu-orig"
        } >"$r/etc/$f.new"
        if cmp -s "$r/etc/$f.new" "$r/etc/$f"; then rm -f "$r/etc/$f.new"; else mv -f "$r/etc/$f.new" "$r/etc/$f"; fi
        chmod 644 "$r/etc/$f"
    done
    cp -f /etc/hosts "$r/etc/hosts"
    mkdir -p "$r$STATE"
    release_binds
    release_wrappers
}

# release_binds: RELEASE_BINDS, the host paths bound into the daemons' namespaces
# (release_host_paths), with their mount points made in the root.
release_binds() {
    local f r=$RELEASE_ROOT
    RELEASE_BINDS=""
    while IFS= read -r f; do
        [ -n "$f" ] || continue
        if [ -d "$f" ]; then
            mkdir -p "$r$f"
        else
            mkdir -p "$r$(dirname "$f")"
            [ -e "$r$f" ] || : >"$r$f"
        fi
        RELEASE_BINDS="$RELEASE_BINDS${RELEASE_BINDS:+:}$f"
    done < <(release_host_paths)
}

# release_wrappers: $STATE/slurm-bin/<command> for each of the root's Slurm client
# commands: the root's loader runs the root's binary on the root's libraries.
release_wrappers() {
    local dir="$STATE/slurm-bin" lib="$RELEASE_ROOT/usr/lib/x86_64-linux-gnu" c
    mkdir -p "$dir"
    for c in sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol scrontab sdiag sinfo \
        sprio squeue sreport srun sshare sstat strigger; do
        [ -x "$RELEASE_ROOT/usr/bin/$c" ] || continue
        write_if_changed "$dir/$c" <<EOF
#!/bin/sh
# Slurm $SLURM_RELEASE's $c from $RELEASE_ROOT (docker/slurm-cluster/release-root.sh).
: "\${SLURM_CONF:=$SLURM_CONF}"
export SLURM_CONF
exec $RELEASE_ROOT/lib64/ld-linux-x86-64.so.2 --argv0 $c \\
    --library-path $lib/slurm-wlm:$lib:$RELEASE_ROOT/lib/x86_64-linux-gnu \\
    $RELEASE_ROOT/usr/bin/$c "\$@"
EOF
        chmod 755 "$dir/$c"
    done
}

# The mounts of a daemon's private namespace; then the daemon, chrooted. $0 is the root.
# shellcheck disable=SC2016 # run by the bash below, with its own arguments.
# $1 is $STATE, $2 the host paths bound read-only at the same paths (colon-separated);
# $3 and $4 only for an AutoDetect=nvidia node (else empty): the `sim-gpu procfs` tree and
# the GPU device files (colon-separated, minor order) that become its /dev/nvidia0...
RELEASE_ENTER='r=$0 s=$1 binds=$2 drv=$3 devs=$4; shift 4
mount --rbind /proc "$r/proc" && mount --rbind /sys "$r/sys" &&
mount -t tmpfs -o mode=755 tmpfs "$r/run" && mkdir -p "$r/run/munge" &&
mount --bind "$s/munge" "$r/run/munge" && mount --bind "$s" "$r$s" || exit 1
set -f; IFS=:
for p in $binds; do mount --bind -o ro "$p" "$r$p" || exit 1; done
unset IFS; set +f
if [ -z "$drv" ]; then mount --rbind /dev "$r/dev" || exit 1; else
  # gpu/nvidia reads /proc/driver/nvidia/gpus/<bus>/information: from the simulated driver.
  mount -t tmpfs -o mode=755 tmpfs "$r/proc/driver" && mkdir -p "$r/proc/driver/nvidia/gpus" &&
  mount --bind "$drv/gpus" "$r/proc/driver/nvidia/gpus" || exit 1
  # ... and /sys/bus/pci/drivers/nvidia/<bus>/local_cpulist (no PCI bus here: a tmpfs /sys/bus).
  d=$r/sys/bus/pci/drivers; [ -d "$d" ] || d=$r/sys/bus
  mount -t tmpfs -o mode=755 tmpfs "$d" && mkdir -p "$r/sys/bus/pci/drivers/nvidia" &&
  mount --bind "$drv/pci-nvidia" "$r/sys/bus/pci/drivers/nvidia" || exit 1
  # A /dev of its own: its /dev/nvidiaN (for it and its jobs) never appear in the host /dev.
  mount -t tmpfs -o mode=755,nosuid tmpfs "$r/dev" || exit 1
  for n in null zero full random urandom tty; do
    : >"$r/dev/$n" && mount --bind "/dev/$n" "$r/dev/$n" || exit 1
  done
  mkdir "$r/dev/pts" "$r/dev/shm" && mount --bind /dev/pts "$r/dev/pts" &&
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/dev/shm" && ln -s pts/ptmx "$r/dev/ptmx" &&
  ln -s /proc/self/fd "$r/dev/fd" && ln -s /proc/self/fd/0 "$r/dev/stdin" &&
  ln -s /proc/self/fd/1 "$r/dev/stdout" && ln -s /proc/self/fd/2 "$r/dev/stderr" || exit 1
  i=0; set -f; IFS=:
  for f in $devs; do : >"$r/dev/nvidia$i" && mount --bind "$f" "$r/dev/nvidia$i" || exit 1; i=$((i + 1)); done
  unset IFS; set +f
fi
exec chroot "$r" "$@"'

# in_root [NODE]: IN_ROOT, the words that run a command as a daemon of this release
# (nothing for 22.05); NODE gpu1 (AutoDetect=nvidia there) also gets the simulated driver.
# Usage: spawn NAME $(in_root) CMD... is not safe for spaces, so callers use the array:
#   in_root; spawn NAME "${IN_ROOT[@]}" CMD...
# shellcheck disable=SC2034 # IN_ROOT is read by lib.sh, which sources this file.
in_root() {
    IN_ROOT=()
    [ -n "$RELEASE_SUITE" ] || return 0
    [ -n "${RELEASE_BINDS+set}" ] || release_binds
    local drv="" devs=""
    if [ "${1:-}" = gpu1 ]; then
        drv="$STATE/sim-nvml/gpu1/driver"
        # The same files as the host-path gres.conf lines, in minor order (install_sim).
        devs=$(paste -sd: "$STATE/sim-nvml/gpu1/slurm-gres-files")
    fi
    IN_ROOT=(unshare -m --propagation private bash -c "$RELEASE_ENTER" "$RELEASE_ROOT" "$STATE"
        "${RELEASE_BINDS:-}" "$drv" "$devs")
}

# release_gpu1_gres: gpu1's gres.conf line. The release beds autodetect it (gpu/nvidia,
# 24.11+; 26.05's env_uuid puts UUIDs in CUDA_VISIBLE_DEVICES); 22.05 has no such plugin.
release_gpu1_gres() {
    case "$SLURM_RELEASE" in
        24.11) echo "NodeName=gpu1 AutoDetect=nvidia Name=gpu Type=a100 Count=4" ;;
        26.05) echo "NodeName=gpu1 AutoDetect=nvidia Name=gpu Type=a100 Count=4 Flags=env_uuid" ;;
        *) echo "NodeName=gpu1 Name=gpu Type=a100 File=$GPU_FILES" ;;
    esac
}

# release_sim_driver NODE: the node's `sim-gpu procfs` tree (release beds: what in_root
# mounts as the driver's /proc and /sys entries). Every `up`, after `sim-gpu create`.
release_sim_driver() {
    [ -n "$RELEASE_SUITE" ] || return 0
    "$STATE/bin/sim-gpu" procfs --dir "$STATE/sim-nvml/$1" --out "$STATE/sim-nvml/$1/driver" >/dev/null
}
