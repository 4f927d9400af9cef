# shellcheck shell=bash
# SLURM_GPU_BED_STORE=nats: the bed's nodes ship over NATS JetStream (issue 26,
# docs/design/jetstream.md), the layout the field's large sites run:
#
#   nats-server   Debian's, JetStream on (store run/nats/), listening on the head node's
#                 bridge address HEAD_ADDR:NATS_PORT (never 0.0.0.0), pid run/nats-server.pid,
#                 log log/nats-server.out; its authorization block (etc/nats-auth.conf) is
#                 `slurm-gpu nats server-config` of the bed's keys: each node may publish on
#                 its own subject only.
#   keys          etc/nats-keys/: nodes/<node>.nk per node (its agent's [nats] credentials)
#                 and workers/ingest.nk (the ingest workers'), from `slurm-gpu nats keygen`.
#   workers       INGEST_WORKERS `slurm-gpu ingest run` on the head node, each with one
#                 store connection, sharing the stream: slurm-gpu-ingest-<n>.
#   network       the nodes' namespaces and links as in the collector's layout (collector.sh).
#
# NATS_PORT is the slurmctld port + 14 (16831 on the default bed). Sourced by lib.sh after
# collector.sh.

NATS_PORT=${SLURM_GPU_NATS_PORT:-$((CTLD_PORT + 14))}
NATS_URL="nats://$HEAD_ADDR:$NATS_PORT"
INGEST_WORKERS=${SLURM_GPU_INGEST_WORKERS:-"1 2"}

nats_on() { [ "$BED_STORE" = nats ]; }
nats_keys() { echo "$STATE/etc/nats-keys"; }

# nats_toml: stdin plus the head node's [nats] section (the workers' key), when on.
nats_toml() {
    cat
    nats_on || return 0
    printf '\n[nats]\n# The bed'"'"'s NATS JetStream (docker/slurm-cluster/nats.sh).\n'
    printf 'url = "%s"\ncredentials = "%s"\n' "$NATS_URL" "$(nats_keys)/workers/ingest.nk"
    # Short waits: a test's agent or worker that lost NATS retries within seconds.
    printf 'commit_wait = "10s"\nack_wait = "10s"\n'
}

# nats_agent_credentials NODE: stdin (an agent's config) with NODE's own key.
nats_agent_credentials() {
    if nats_on; then
        sed "s|^credentials = .*|credentials = \"$(nats_keys)/nodes/$1.nk\"|"
    else
        cat
    fi
}

# nats_keygen: the nodes' and the workers' keys, once (kept across `up`s).
nats_keygen() {
    nats_on || return 0
    local keys n
    keys=$(nats_keys)
    for n in $NODES; do
        [ -f "$keys/nodes/$n.nk" ] && continue
        nats_cli keygen "$n" --dir "$keys" >/dev/null
    done
    [ -f "$keys/workers/ingest.nk" ] || nats_cli keygen ingest --worker --dir "$keys" >/dev/null
}

nats_cli() {
    local venv=${VENV:-${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}}
    env ${SLURM_GPU_PYTHONPATH:+PYTHONPATH="$SLURM_GPU_PYTHONPATH"} \
        SLURM_GPU_CONFIG="$STATE/etc/slurm-gpu.toml" "$venv/bin/slurm-gpu" nats "$@"
}

# start_nats: nats-server with JetStream on the bed's bridge, the keys' authorization.
start_nats() {
    nats_on || return 0
    is_running nats-server && return 0
    nats_keygen
    mkdir -p "$STATE/run/nats"
    nats_cli server-config --dir "$(nats_keys)" | write_if_changed "$STATE/etc/nats-auth.conf"
    {
        printf 'listen: "%s:%s"\n' "$HEAD_ADDR" "$NATS_PORT"
        printf 'jetstream { store_dir: "%s" }\n' "$STATE/run/nats"
        printf 'include "nats-auth.conf"\n'
    } | write_if_changed "$STATE/etc/nats-server.conf"
    spawn nats-server nats-server -c "$STATE/etc/nats-server.conf"
    wait_for nats-server 30 bash -c "exec 3<>/dev/tcp/$HEAD_ADDR/$NATS_PORT"
}

stop_nats() { stop_daemon nats-server; }

# start_ingest N: ingest worker N (`slurm-gpu ingest run` on the bed's config).
start_ingest() {
    nats_on || return 0
    is_running "slurm-gpu-ingest-$1" && return 0
    local venv=${VENV:-${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}}
    spawn "slurm-gpu-ingest-$1" env ${SLURM_GPU_PYTHONPATH:+PYTHONPATH="$SLURM_GPU_PYTHONPATH"} \
        SLURM_GPU_CONFIG="$STATE/etc/slurm-gpu.toml" SLURM_CONF="$SLURM_CONF" \
        "$venv/bin/slurm-gpu" ingest run
}

stop_ingest() { stop_daemon "slurm-gpu-ingest-$1"; }

# nats_up: the server, then its workers.
nats_up() {
    nats_on || return 0
    start_nats
    local n
    for n in $INGEST_WORKERS; do start_ingest "$n"; done
}

# stop_daemon NAME: SIGTERM by its pid file, SIGKILL after 15 s.
stop_daemon() {
    local pf
    pf=$(pidfile "$1")
    [ -f "$pf" ] || return 0
    kill -TERM "$(cat "$pf")" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$(cat "$pf")" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$(cat "$pf")" 2>/dev/null || true
    rm -f "$pf"
}

# nats_env_lines: `local-cluster env` lines of this layout.
nats_env_lines() {
    nats_on || return 0
    echo "export SLURM_GPU_NATS_URL='$NATS_URL'"
    echo "export SLURM_GPU_INGEST_WORKERS='$INGEST_WORKERS'"
}
