# shellcheck shell=bash
# Prometheus and the slurm-gpu exporter for the test bed.
#
# Sourced by lib.sh, which defines STATE, REPO_ROOT, SLURM_CONF, log, die, spawn, wait_for,
# is_running and write_if_changed. Everything lives under $STATE:
#   etc/prometheus.yml         rendered here: scrapes the two node agents and the exporter
#   etc/slurm-gpu-rules.yml    a copy of conf/prometheus/slurm-gpu-rules.yml
#   prometheus/                its TSDB (owned by the prometheus user when there is one)
#   log/prometheus.out  log/slurm-gpu-exporter.out
# Prometheus listens on 127.0.0.1:${SLURM_GPU_PROM_PORT:-19090}; the exporter on
# 127.0.0.1:${SLURM_GPU_EXPORTER_PORT:-19900}; the agents on 127.0.0.1:19901 and :19902
# (local-cluster's agent_metrics_port).
#
# Prometheus is Debian's package (/usr/bin/prometheus, apt-get install prometheus); when
# it is missing, start_prometheus says so and the rest of the test bed runs without it.

PROM_BIN=${SLURM_GPU_PROM_BIN:-/usr/bin/prometheus}
PROM_PORT=${SLURM_GPU_PROM_PORT:-19090}
PROM_ADDR=127.0.0.1
EXPORTER_PORT=${SLURM_GPU_EXPORTER_PORT:-${SLURM_GPU_METRICS_PORT_BASE:-19900}}

# http_ok URL: succeeds when URL answers 2xx (python3 is a test-bed package; curl is not).
http_ok() {
    /usr/bin/python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1"
}

render_prometheus_config() {
    local base=${SLURM_GPU_METRICS_PORT_BASE:-19900}
    mkdir -p "$STATE/etc"
    write_if_changed "$STATE/etc/slurm-gpu-rules.yml" <"$REPO_ROOT/conf/prometheus/slurm-gpu-rules.yml"
    # Job names as in conf/prometheus/prometheus.yml: the rules and dashboards use them.
    write_if_changed "$STATE/etc/prometheus.yml" <<EOF
# Rendered by docker/slurm-cluster/prometheus.sh for the test bed.
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $STATE/etc/slurm-gpu-rules.yml
scrape_configs:
  - job_name: slurm-gpu-agents
    static_configs:
      - targets: ["127.0.0.1:$((base + 1))", "127.0.0.1:$((base + 2))"]
  - job_name: slurm-gpu-exporter
    static_configs:
      - targets: ["127.0.0.1:$EXPORTER_PORT"]
EOF
    chmod 644 "$STATE/etc/prometheus.yml" "$STATE/etc/slurm-gpu-rules.yml"
}

start_prometheus() {
    if [ ! -x "$PROM_BIN" ]; then
        log "prometheus not installed ($PROM_BIN); skipping it (apt-get install prometheus)"
        return 0
    fi
    mkdir -p "$STATE/prometheus" "$STATE/run" "$STATE/log"
    render_prometheus_config
    if is_running prometheus; then
        # A changed config or rules file is picked up without a restart.
        kill -HUP "$(cat "$(pidfile prometheus)")" 2>/dev/null || true
    else
        local as=()
        if id prometheus >/dev/null 2>&1; then
            chown -R prometheus: "$STATE/prometheus"
            as=(runuser -u prometheus --)
        fi
        spawn prometheus "${as[@]}" "$PROM_BIN" \
            --config.file="$STATE/etc/prometheus.yml" \
            --storage.tsdb.path="$STATE/prometheus" \
            --storage.tsdb.retention.time=7d \
            --web.listen-address="$PROM_ADDR:$PROM_PORT"
    fi
    wait_for prometheus 60 http_ok "http://$PROM_ADDR:$PROM_PORT/-/ready"
}

# start_exporter [VENV]: `slurm-gpu exporter` on the test bed's config.
start_exporter() {
    local venv=${1:-${VENV:-${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}}}
    is_running slurm-gpu-exporter && return 0
    [ -x "$venv/bin/slurm-gpu" ] || die "slurm-gpu is not installed in $venv (run scripts/install-deps)"
    spawn slurm-gpu-exporter env SLURM_GPU_CONFIG="$STATE/etc/slurm-gpu.toml" \
        SLURM_CONF="$SLURM_CONF" "$venv/bin/slurm-gpu" exporter \
        --listen "127.0.0.1:$EXPORTER_PORT"
    wait_for slurm-gpu-exporter 30 http_ok "http://127.0.0.1:$EXPORTER_PORT/metrics"
}
