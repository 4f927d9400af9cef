# shellcheck shell=bash
# The shapes bed (SLURM_GPU_BED_SHAPES=1): the test bed plus two nodes whose GPUs are
# shared, for issue 14 (docs/design/gpu-slots.md). Off by default: without it nothing here
# changes the bed.
#
#   gpu3  two simulated H100s in MIG mode: minor 0 as 7 x 1g.10gb, minor 1 as
#         3g.40gb + 4g.40gb (`sim-gpu mig`). gres.conf has one MultipleFiles= line per MIG
#         device: the parent's device file, then its GPU and compute instance capability
#         files $STATE/dev/nvidia-caps/nvidia-cap<minor> (mknod; the minors from the sim's
#         nvidia-caps/mig-minors), in the order slurmd's _handle_mig writes them. No
#         AutoDetect: Slurm gives such a job SLURM_JOB_GPUS (and CUDA_VISIBLE_DEVICES) = the
#         line's index among the node's GPU lines, no MIG UUID.
#   gpu4  one simulated A100, whole, with `Name=shard Count=8` on it.
#   Both in partition "shapes" only, so the gpu and debug partitions keep gpu1 and gpu2.
#
# Why two nodes and not one: Slurm 22.05's gres/shard plugin splits every MultipleFiles=
# record into one GPU per file when it loads on a node (gres_c_s.c _build_sharing_list;
# SchedMD bug 17482, fixed in 23.02.7 by commit 4438cab1d8), and it loads on every slurmd
# once GresTypes names shard. `slurmd -G` shows it: each 1g.10gb slice becomes three GPUs.
# So on 22.05 gpu3's slurmd reads its own copy of slurm.conf with GresTypes=gpu
# (etc/slurm-gpu3.conf): a 22.05 site cannot have MIG and shards on one node either.
#
# Sourced by lib.sh, which defines STATE, CLUSTER_SRC, GPU_FILES, SLURM_RELEASE, log, die
# and write_if_changed.

SHAPES=${SLURM_GPU_BED_SHAPES:-0}
NODE3_PORT=${SLURM_GPU_NODE3_PORT:-16903}
NODE4_PORT=${SLURM_GPU_NODE4_PORT:-16904}
NODE3_HOST=${SLURM_GPU_NODE3_HOST:-localhost}
NODE3_ADDR=${SLURM_GPU_NODE3_ADDR:-127.0.0.1}
NODE4_HOST=${SLURM_GPU_NODE4_HOST:-localhost}
NODE4_ADDR=${SLURM_GPU_NODE4_ADDR:-127.0.0.1}
# shellcheck disable=SC2034 # lib.sh adds them to NODES.
SHAPE_NODES="gpu3 gpu4"
# The MIG layouts of gpu3's two H100s, by minor.
SHAPES_MIG_LAYOUTS="0=1g.10gb*7 1=3g.40gb+4g.40gb"
SHAPES_SHARDS=8
# nvidia-caps' character major is dynamic on hardware (/proc/devices); slurmd and slurm-gpu
# go by the file's name (nvidia-cap<minor>), as slurmd's _handle_mig names them.
CAPS_MAJOR=508

shapes_on() { [ "$SHAPES" = 1 ]; }

# shapes_sim: gpu3's and gpu4's simulated GPUs and gpu3's MIG layouts, before gres.conf is
# rendered from them. Uses the checkout's sim-gpu (install_sim installs it later).
shapes_sim() {
    local sim=$CLUSTER_SRC/bin/sim-gpu h100="NVIDIA H100 80GB HBM3" spec
    "$sim" create --dir "$STATE/sim-nvml/gpu3" --node gpu3 --models "$h100,$h100" \
        --memory-mibs 81559,81559 >/dev/null
    for spec in $SHAPES_MIG_LAYOUTS; do
        "$sim" mig --dir "$STATE/sim-nvml/gpu3" --gpu "minor:${spec%%=*}" --layout "${spec#*=}" >/dev/null
    done
    "$sim" create --dir "$STATE/sim-nvml/gpu4" --node gpu4 --model "NVIDIA A100-SXM4-80GB" \
        --memory-mib 81920 --count 1 >/dev/null
}

# shapes_gpu_file MINOR: the device file of GPU MINOR (as make_gpu_devices made them).
shapes_gpu_file() {
    case "$GPU_FILES" in
        */nvidia\[0-3\]) echo "$STATE/dev/nvidia$1" ;;
        *) echo "/dev/tty$1" ;;
    esac
}

# shapes_mig_entries: one "PROFILE FILES" line per MIG device of gpu3, in slurmd's index
# order (GPU minor, then MIG device index), FILES as gres.conf's MultipleFiles= value.
shapes_mig_entries() {
    local dir=$STATE/sim-nvml/gpu3 minors spec m uuid key gi ci profile _s _mib _u gim cim
    minors=$dir/nvidia-caps/mig-minors
    [ -r "$minors" ] || die "no $minors: sim-gpu mig did not run"
    for spec in $SHAPES_MIG_LAYOUTS; do
        m=${spec%%=*}
        uuid=$(grep -lx "minor=$m" "$dir"/gpus/*/info | head -1)
        uuid=$(basename "$(dirname "$uuid")")
        while IFS=' =' read -r key gi ci profile _s _mib _u; do
            [ "$key" = instance ] || continue
            gim=$(awk -v n="gpu$m/gi$gi/access" '$1 == n { print $2 }' "$minors")
            cim=$(awk -v n="gpu$m/gi$gi/ci$ci/access" '$1 == n { print $2 }' "$minors")
            if [ -z "$gim" ] || [ -z "$cim" ]; then die "$minors has no gpu$m/gi$gi or its ci$ci"; fi
            echo "$profile $(shapes_gpu_file "$m"),$STATE/dev/nvidia-caps/nvidia-cap$gim,$STATE/dev/nvidia-caps/nvidia-cap$cim"
        done <"$dir/gpus/$uuid/mig"
    done
}

# shapes_caps: the capability device files gpu3's MultipleFiles= lines name. Regular files
# where mknod is not allowed: only their names matter here (no cgroup device constraint).
shapes_caps() {
    local _p files f minor
    mkdir -p "$STATE/dev/nvidia-caps"
    while read -r _p files; do
        for f in ${files//,/ }; do
            case "$f" in */nvidia-caps/nvidia-cap*) ;; *) continue ;; esac
            [ -e "$f" ] && continue
            minor=${f##*nvidia-cap}
            mknod -m 444 "$f" c "$CAPS_MAJOR" "$minor" 2>/dev/null || : >"$f"
        done
    done < <(shapes_mig_entries)
}

# shapes_gres_types: gpu3's Gres= types in order of first appearance ("1g.10gb:7 ...").
shapes_gres_types() {
    shapes_mig_entries | awk '{ if (!($1 in n)) order[k++] = $1; n[$1]++ }
        END { for (i = 0; i < k; i++) printf "%s%s:%d", (i ? " " : ""), order[i], n[order[i]] }'
}

# shapes_gres_lines: gpu3's and gpu4's gres.conf lines. gpu3's are grouped by type in the
# order slurm.conf's Gres= names them (slurmd numbers a node's GPUs type by type, in that
# order), which is also their listing order here.
shapes_gres_lines() {
    local profile files
    echo "# Shapes bed (SLURM_GPU_BED_SHAPES=1, docker/slurm-cluster/shapes.sh): gpu3's MIG"
    echo "# devices (parent device file, GPU and compute instance capability files) and gpu4's"
    echo "# A100 cut into $SHAPES_SHARDS shards."
    while read -r profile files; do
        echo "NodeName=gpu3 Name=gpu Type=$profile MultipleFiles=$files"
    done < <(shapes_mig_entries)
    echo "NodeName=gpu4 Name=gpu Type=a100 File=$(shapes_gpu_file 0)"
    echo "NodeName=gpu4 Name=shard Count=$SHAPES_SHARDS File=$(shapes_gpu_file 0)"
}

# shapes_conf_lines: stdin (slurm.conf) with gres/shard, the MIG types' TRES, gpu3, gpu4
# and their partition.
shapes_conf_lines() {
    local types gres tres t
    types=$(shapes_gres_types)
    gres=""
    tres=",gres/shard"
    for t in $types; do
        gres="$gres${gres:+,}gpu:$t"
        tres="$tres,gres/gpu:${t%%:*}"
    done
    sed -e 's/^GresTypes=gpu$/GresTypes=gpu,shard/' -e "s|^\(AccountingStorageTRES=.*\)$|\1$tres|"
    echo "# Shapes bed (docker/slurm-cluster/shapes.sh): MIG slices on gpu3, shards on gpu4."
    echo "NodeName=gpu3 NodeHostname=$NODE3_HOST NodeAddr=$NODE3_ADDR Port=$NODE3_PORT CPUs=8 RealMemory=4000 Gres=$gres State=UNKNOWN"
    echo "NodeName=gpu4 NodeHostname=$NODE4_HOST NodeAddr=$NODE4_ADDR Port=$NODE4_PORT CPUs=8 RealMemory=4000 Gres=gpu:a100:1,shard:$SHAPES_SHARDS State=UNKNOWN"
    echo "PartitionName=shapes Nodes=gpu3,gpu4 MaxTime=INFINITE State=UP"
    if [ "$SLURM_RELEASE" = 22.05 ]; then
        # gpu3's own slurm.conf differs on purpose (shapes_gpu3_conf): slurmctld would log
        # "Node gpu3 appears to have a different slurm.conf" at every registration.
        echo "DebugFlags=NO_CONF_HASH"
    fi
}

# shapes_prepare: before the configs are rendered: the simulated GPUs they are made from
# and the capability files they name.
shapes_prepare() {
    shapes_on || return 0
    shapes_sim
    shapes_caps
}

# shapes_slurm_conf: stdin (slurm.conf) as it is, or with the shapes lines.
shapes_slurm_conf() {
    if shapes_on; then shapes_conf_lines; else cat; fi
}

# shapes_gres_conf: stdin (gres.conf) as it is, or with the shapes lines after it.
shapes_gres_conf() {
    cat
    if shapes_on; then shapes_gres_lines; fi
}

# shapes_slurmd_conf NODE: the slurm.conf NODE's slurmd reads.
shapes_slurmd_conf() {
    if shapes_on && [ "$1" = gpu3 ] && [ "$SLURM_RELEASE" = 22.05 ]; then
        echo "$STATE/etc/slurm-gpu3.conf"
    else
        echo "$SLURM_CONF"
    fi
}

# shapes_gpu3_conf: etc/slurm-gpu3.conf, slurm.conf without gres/shard (22.05 only).
shapes_gpu3_conf() {
    shapes_on && [ "$SLURM_RELEASE" = 22.05 ] || return 0
    {
        echo "# gpu3's slurmd on Slurm 22.05: slurm.conf without gres/shard, whose plugin would"
        echo "# split its MultipleFiles= GPUs (docker/slurm-cluster/shapes.sh)."
        sed -e 's/^GresTypes=gpu,shard$/GresTypes=gpu/' \
            -e '/^NodeName=/s/,shard:[0-9]*//' "$SLURM_CONF"
    } | write_if_changed "$STATE/etc/slurm-gpu3.conf"
    chmod 644 "$STATE/etc/slurm-gpu3.conf"
}

# shapes_gres_files NODE: NODE's slurm-gres-files (sim-nvml README): one line per Slurm
# GPU index, a MIG device's line its MultipleFiles= list.
shapes_gres_files() {
    case "$1" in
        gpu3) shapes_mig_entries | cut -d' ' -f2- ;;
        gpu4) shapes_gpu_file 0 ;;
    esac
}

# shapes_toml: stdin (slurm-gpu.toml) with [node] mig_minors = gpu3's mig-minors.
shapes_toml() {
    if shapes_on; then
        sed "/^\[node\]$/a mig_minors = \"$STATE/sim-nvml/gpu3/nvidia-caps/mig-minors\""
    else
        cat
    fi
}
