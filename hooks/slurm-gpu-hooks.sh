# shellcheck shell=sh
# slurm-gpu-hooks.sh: what the slurm-gpu prolog and epilog share, sourced by both with
# `.` (a builtin: no fork). Not a hook itself, and not executable: keep it out of a
# prolog.d directory, where slurmd would try to run it.
#
# The hook sets HOOK (its name), the EXIT trap and `set -f` before sourcing this file,
# then calls hook_begin, which reads the config, the node and the job, and makes sure
# the state directories exist. On return these are set for the hook:
#   node job  the cleaned SLURMD_NODENAME (or hostname) and SLURM_JOB_ID
#   gpus      Slurm's GPU indices of the job, "0,1" (may be empty)
#   uuids     the same GPUs' UUIDs in the same order, "GPU-..,GPU-..", when
#             CUDA_VISIBLE_DEVICES names them by UUID (gres.conf Flags=env_uuid), else empty
#   body      the key=value lines both hooks write after job_id (uid ... het ids)
#   nd        $STATE_DIR/$node, with bindings/ and events/ in it
# When there is nothing to record (no job id, no node name, no state dir), hook_begin
# logs why and exits 0 itself.
#
# Rules (DESIGN.md "Rules that make it trustworthy"), which every line here keeps:
# - Exit 0 whatever happens: a prolog or epilog that exits non-zero drains the node
#   (https://slurm.schedmd.com/prolog_epilog.html).
# - Milliseconds: POSIX sh builtins only; the only external program here is mkdir,
#   run when the state directories are missing, and logger on the failure path.
# - Environment values are data, never code: ids must be digits, names keep only
#   [A-Za-z0-9._@-]; nothing is eval'd and the config is parsed, not sourced.
# - Failures are logged as one line (LOG_FILE, plus syslog via logger).

STATE_DIR=/var/lib/slurm-gpu/node
LOG_FILE=/var/log/slurm-gpu/hooks.log
SYSLOG=yes
node=
job=

# log MESSAGE: one line, what failed and where. Failure path only.
log() {
    msg="$HOOK: node=${node:-?} job=${job:-?}: $*"
    if ! { printf '%s\n' "$msg" >>"$LOG_FILE"; } 2>/dev/null; then
        /bin/mkdir -p -- "${LOG_FILE%/*}" 2>/dev/null
        { printf '%s\n' "$msg" >>"$LOG_FILE"; } 2>/dev/null
    fi
    if [ "$SYSLOG" = yes ] && [ -x /usr/bin/logger ]; then
        /usr/bin/logger -t slurm-gpu-hook -- "$msg" </dev/null >/dev/null 2>&1
    fi
}

# clean VALUE: r = VALUE with only [A-Za-z0-9._@-] kept (at most 128 chars).
clean() {
    case $1 in
    *[!A-Za-z0-9._@-]*) ;;
    *) r=$1; [ ${#r} -le 128 ] && return ;;
    esac
    r=
    s=$1
    i=0
    while [ -n "$s" ] && [ $i -lt 128 ]; do
        t=${s#?}
        c=${s%"$t"}
        s=$t
        case $c in [A-Za-z0-9._@-]) r=$r$c; i=$((i + 1)) ;; esac
    done
}

# digits VALUE: r = VALUE if it is 1-19 digits, else empty.
digits() {
    case $1 in
    '' | *[!0-9]*) r= ;;
    *) if [ ${#1} -le 19 ]; then r=$1; else r=; fi ;;
    esac
}

# conf_path KEY VALUE: r = VALUE if it is a plain absolute path, else log.
conf_path() {
    case $2 in
    /*[!A-Za-z0-9._/@+-]* | '' | [!/]*)
        log "config $conf: $1 is not an absolute path of [A-Za-z0-9._/@+-], default kept"
        return 1 ;;
    esac
    r=$2
}

# read_conf: STATE_DIR, LOG_FILE, SYSLOG from slurm-gpu-hooks.conf next to the hook
# (next to a symlink, not its target), else /etc/slurm-gpu/hooks.conf, else defaults.
# Parsed line by line with the read builtin; never sourced (we run as root).
read_conf() {
    case $0 in */*) conf=${0%/*}/slurm-gpu-hooks.conf ;; *) conf=./slurm-gpu-hooks.conf ;; esac
    [ -f "$conf" ] || conf=/etc/slurm-gpu/hooks.conf
    [ -f "$conf" ] || return 0
    n=0
    bad=
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        if [ $n -gt 1000 ]; then
            bad="$bad ${n}+(too long, rest ignored)"
            break
        fi
        case $line in
        '' | '#'*) continue ;;
        *=*) k=${line%%=*} v=${line#*=} ;;
        *) bad="$bad $n"; continue ;;
        esac
        case $k in
        STATE_DIR) conf_path STATE_DIR "$v" && STATE_DIR=$r ;;
        LOG_FILE) conf_path LOG_FILE "$v" && LOG_FILE=$r ;;
        SYSLOG) case $v in yes | no) SYSLOG=$v ;; *) bad="$bad $n" ;; esac ;;
        '' | [0-9]* | *[!A-Za-z0-9_]*) bad="$bad $n" ;;
        *) ;; # unknown key: ignored (newer config, older hook)
        esac
        line=
    done <"$conf" 2>/dev/null || log "config $conf: unreadable, defaults used"
    [ -z "$bad" ] || log "config $conf: malformed line(s)$bad ignored"
}

# read_node: node = slurmd's name (several slurmd may share one host), else the
# kernel's short hostname read without forking. Exits 0 when there is none.
read_node() {
    clean "$SLURMD_NODENAME"
    node=$r
    if [ -z "$node" ]; then
        { read -r h </proc/sys/kernel/hostname; } 2>/dev/null || { read -r h </etc/hostname; } 2>/dev/null
        clean "${h%%.*}"
        node=$r
    fi
    case $node in
    '' | .*) log "no usable SLURMD_NODENAME or hostname, nothing written"; exit 0 ;;
    esac
}

# gpu_uuid VALUE: r = VALUE if it is a whole GPU UUID as nvidia-smi -L prints it
# (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, hex digits), else empty.
gpu_uuid() {
    r=
    case $1 in
    GPU-????????-????-????-????-????????????)
        case ${1#GPU-} in *[!0-9a-fA-F-]*) ;; *) r=$1 ;; esac ;;
    esac
}

# index_list LIST: r = the digits entries of LIST as "0,1" (ranges "0-3" expanded);
# bad = the number of entries that are neither.
index_list() {
    r=
    bad=0
    IFS=,
    for g in $1; do
        case $g in
        *-*)
            a=${g%%-*} b=${g#*-}
            case $a in '' | *[!0-9]*) bad=$((bad + 1)); continue ;; esac
            case $b in '' | *[!0-9]*) bad=$((bad + 1)); continue ;; esac
            if [ ${#a} -le 4 ] && [ ${#b} -le 4 ] && [ "$a" -le "$b" ] && [ $((b - a)) -lt 64 ]; then
                while [ "$a" -le "$b" ]; do r=$r${r:+,}$((a + 0)); a=$((a + 1)); done
            else
                bad=$((bad + 1))
            fi ;;
        *)
            case $g in
            '' | *[!0-9]*) bad=$((bad + 1)) ;;
            *) if [ ${#g} -le 19 ]; then r=$r${r:+,}$g; else bad=$((bad + 1)); fi ;;
            esac ;;
        esac
    done
    unset IFS
}

# read_gpus: gpus = the job's GPUs as Slurm's indices, "0,1" (ranges "0-3" accepted),
# from SLURM_JOB_GPUS; CUDA_VISIBLE_DEVICES only when SLURM_JOB_GPUS is absent altogether.
# uuids = their UUIDs when CUDA_VISIBLE_DEVICES lists UUIDs (gres.conf Flags=env_uuid,
# Slurm 26.05; slurmd's prolog/epilog environment then carries each device's UUID there
# and its index in SLURM_JOB_GPUS, both built in one loop over the allocated devices, in
# the same order: src/plugins/gres/common/gres_common.c, gres_common_prep_set_env). A
# list that mixes UUIDs with other values, or whose length differs from SLURM_JOB_GPUS,
# is logged and not used: the job is then bound by SLURM_JOB_GPUS alone, or (without it)
# not at all, never to a guessed GPU.
read_gpus() {
    uuids=
    cvd=${CUDA_VISIBLE_DEVICES-}
    if [ "${SLURM_JOB_GPUS+set}" = set ]; then
        index_list "$SLURM_JOB_GPUS"
        gpus=$r
    else
        gpus=
    fi
    case $cvd in
    *GPU-* | *MIG-*) ;;
    *)
        if [ "${SLURM_JOB_GPUS+set}" != set ] && [ "$cvd" != NoDevFiles ]; then
            index_list "$cvd"
            gpus=$r
            [ "$bad" = 0 ] || log "CUDA_VISIBLE_DEVICES (no SLURM_JOB_GPUS) has $bad entries that are neither GPU indices nor UUIDs: dropped${gpus:+, bound by $gpus}"
        fi
        return 0 ;;
    esac
    n=0
    odd=
    shown=
    IFS=,
    for g in $cvd; do
        gpu_uuid "$g"
        if [ -n "$r" ]; then uuids=$uuids${uuids:+,}$r; n=$((n + 1)); else odd=yes; fi
        clean "$g"
        shown=$shown${shown:+,}$r
    done
    unset IFS
    if [ -n "$odd" ]; then
        uuids=
        log "CUDA_VISIBLE_DEVICES=$shown mixes GPU UUIDs with other values (MIG devices are not bound by UUID): not bound by UUID${gpus:+, bound by SLURM_JOB_GPUS=$gpus}"
        return 0
    fi
    if [ "${SLURM_JOB_GPUS+set}" = set ]; then
        m=0
        IFS=,
        for g in $gpus; do m=$((m + 1)); done
        unset IFS
        if [ "$m" != "$n" ]; then
            uuids=
            log "CUDA_VISIBLE_DEVICES=$shown lists $n GPU UUIDs but SLURM_JOB_GPUS=$gpus $m indices: not bound by UUID, bound by SLURM_JOB_GPUS"
        fi
    fi
}

# read_body: body = the job's cleaned fields as key=value lines, one per line, in the
# order conf/slurm-hooks.md documents; the array and het ids and the restart count only
# when slurmd set them.
read_body() {
    # shellcheck disable=SC2153 # slurmd sets it (not a misspelling of SLURM_JOB_SLUID)
    digits "$SLURM_JOB_UID"; uid=$r
    clean "$SLURM_JOB_USER"; user=$r
    clean "$SLURM_JOB_ACCOUNT"; account=$r
    clean "$SLURM_JOB_PARTITION"; partition=$r
    clean "$SLURM_CLUSTER_NAME"; cluster=$r
    body="uid=$uid
user=$user
account=$account
partition=$partition
cluster=$cluster
"
    # The job's SLUID (Slurm 25.11+: "s" and 13 base-32 characters), which names its
    # cgroup there unless cgroup.conf says CgroupJobIdPaths=yes.
    if [ -n "$SLURM_JOB_SLUID" ]; then clean "$SLURM_JOB_SLUID"; body="${body}sluid=$r
"; fi
    if [ -n "$SLURM_ARRAY_JOB_ID" ]; then digits "$SLURM_ARRAY_JOB_ID"; body="${body}array_job_id=$r
"; fi
    if [ -n "$SLURM_ARRAY_TASK_ID" ]; then digits "$SLURM_ARRAY_TASK_ID"; body="${body}array_task_id=$r
"; fi
    if [ -n "$SLURM_HET_JOB_ID" ]; then digits "$SLURM_HET_JOB_ID"; body="${body}het_job_id=$r
"; fi
    if [ -n "$SLURM_HET_JOB_OFFSET" ]; then digits "$SLURM_HET_JOB_OFFSET"; body="${body}het_job_offset=$r
"; fi
    # Which run of the job this is: a requeued job runs again under its id, and Slurm
    # counts its runs (0 or unset for the first). Not every slurmd sets it for the prolog;
    # the agent then tells the runs apart itself.
    restart=${SLURM_RESTART_COUNT:-$SLURM_JOB_RESTART_COUNT}
    if [ -n "$restart" ]; then digits "$restart"; body="${body}restart=$r
"; fi
}

# hook_begin: everything both hooks do before writing (see the top of this file).
hook_begin() {
    read_conf
    read_node
    digits "$SLURM_JOB_ID"
    job=$r
    if [ -z "$job" ]; then
        log "SLURM_JOB_ID missing or not digits, nothing written"
        exit 0
    fi
    read_gpus
    read_body
    nd=$STATE_DIR/$node
    if ! { [ -d "$nd/bindings" ] && [ -d "$nd/events" ]; }; then
        if ! /bin/mkdir -p -- "$nd/bindings" "$nd/events" 2>/dev/null; then
            log "cannot create $nd/{bindings,events}, nothing written"
            exit 0
        fi
    fi
}
