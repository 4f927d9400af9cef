# shellcheck shell=bash
# Prometheus, Alertmanager and the slurm-gpu exporter for the test bed.
#
# Sourced by lib.sh, which defines STATE, REPO_ROOT, SLURM_CONF, log, die, spawn, wait_for,
# is_running and write_if_changed. Everything lives under $STATE:
#   etc/prometheus.yml         rendered here: scrapes the two node agents and the exporter,
#                              alerts to the Alertmanager below
#   etc/slurm-gpu-rules.yml    conf/prometheus/slurm-gpu-rules.yml with short windows: every
#                              `for:` is ${SLURM_GPU_ALERT_FOR:-10s}, every [range] is
#                              [${SLURM_GPU_ALERT_WINDOW:-1m}]
#   etc/alertmanager.yml       conf/alertmanager/slurm-gpu.yml delivering on loopback: mail
#                              to 127.0.0.1:${SLURM_GPU_ALERT_SMTP_PORT:-19925} (no TLS),
#                              Slack posts to http://127.0.0.1:${SLURM_GPU_ALERT_HOOK_PORT:-19926}/slack,
#                              group_wait 1s, group_interval 5s, resolve_timeout 1m. Nothing
#                              listens there by default (deliveries fail, and are logged);
#                              tests/integration/test_alerts.py points it at its receivers
#                              (rewrites the two addresses, POST /-/reload) and restores it.
#   prometheus/ alertmanager/  their storage (owned by the prometheus user when there is one)
#   log/prometheus.out  log/alertmanager.out  log/slurm-gpu-exporter.out
# Prometheus listens on 127.0.0.1:${SLURM_GPU_PROM_PORT:-19090}, Alertmanager on
# 127.0.0.1:${SLURM_GPU_ALERTMANAGER_PORT:-Prometheus's + 3} (clustering off: no gossip port;
# it runs while Prometheus runs, see start_alertmanager), the
# exporter on 127.0.0.1:${SLURM_GPU_EXPORTER_PORT:-19900}; the agents on ports 19901 and
# 19902 (local-cluster's agent_metrics_port) of their node's address (collector.sh's
# agent_metrics_host: 127.0.0.1 with SLURM_GPU_BED_STORE=sqlite).
#
# Prometheus and Alertmanager are Debian's packages (/usr/bin/prometheus, apt-get install
# prometheus; /usr/bin/prometheus-alertmanager, apt-get install prometheus-alertmanager);
# when one is missing, its start says so and the rest of the test bed runs without it.

PROM_BIN=${SLURM_GPU_PROM_BIN:-/usr/bin/prometheus}
PROM_PORT=${SLURM_GPU_PROM_PORT:-19090}
PROM_ADDR=127.0.0.1
AM_BIN=${SLURM_GPU_ALERTMANAGER_BIN:-/usr/bin/prometheus-alertmanager}
# Next to Prometheus: a bed with its own Prometheus port gets its own Alertmanager port.
AM_PORT=${SLURM_GPU_ALERTMANAGER_PORT:-$((PROM_PORT + 3))}
ALERT_SMTP_PORT=${SLURM_GPU_ALERT_SMTP_PORT:-19925}
ALERT_HOOK_PORT=${SLURM_GPU_ALERT_HOOK_PORT:-19926}
ALERT_FOR=${SLURM_GPU_ALERT_FOR:-10s}
ALERT_WINDOW=${SLURM_GPU_ALERT_WINDOW:-1m}
EXPORTER_PORT=${SLURM_GPU_EXPORTER_PORT:-${SLURM_GPU_METRICS_PORT_BASE:-19900}}

# http_ok URL: succeeds when URL answers 2xx (python3 is a test-bed package; curl is not).
http_ok() {
    /usr/bin/python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1"
}

render_prometheus_config() {
    local base=${SLURM_GPU_METRICS_PORT_BASE:-19900} agents n
    # Every node's agent (gpuN on base + N): gpu1 and gpu2, and the shapes bed's nodes.
    agents=""
    # On its node's address when it runs in the node's network namespace (collector.sh).
    for n in ${NODES:-gpu1 gpu2}; do
        agents="$agents${agents:+, }\"$(agent_metrics_host "$n"):$((base + ${n#gpu}))\""
    done
    mkdir -p "$STATE/etc"
    # The shipped rules with test-bed windows: alerts within seconds, not hours.
    sed -E -e "s/^([[:space:]]*for:[[:space:]]*).*/\1$ALERT_FOR/" \
        -e "s/\[[0-9]+[smhd]\]/[$ALERT_WINDOW]/g" \
        "$REPO_ROOT/conf/prometheus/slurm-gpu-rules.yml" |
        write_if_changed "$STATE/etc/slurm-gpu-rules.yml"
    # Job names as in conf/prometheus/prometheus.yml: the rules and dashboards use them.
    write_if_changed "$STATE/etc/prometheus.yml" <<EOF
# Rendered by docker/slurm-cluster/prometheus.sh for the test bed.
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $STATE/etc/slurm-gpu-rules.yml
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["$PROM_ADDR:$AM_PORT"]
scrape_configs:
  - job_name: slurm-gpu-agents
    static_configs:
      - targets: [$agents]
  - job_name: slurm-gpu-exporter
    static_configs:
      - targets: ["127.0.0.1:$EXPORTER_PORT"]
EOF
    chmod 644 "$STATE/etc/prometheus.yml" "$STATE/etc/slurm-gpu-rules.yml"
}

# The shipped Alertmanager config, delivering on loopback with test-bed timings.
render_alertmanager_config() {
    mkdir -p "$STATE/etc"
    sed -E -e "s|^([[:space:]]*smtp_smarthost:).*|\1 \"127.0.0.1:$ALERT_SMTP_PORT\"|" \
        -e "s|^([[:space:]]*smtp_require_tls:).*|\1 false|" \
        -e "s|^([[:space:]]*- api_url:).*|\1 \"http://127.0.0.1:$ALERT_HOOK_PORT/slack\"|" \
        -e "s|^([[:space:]]*group_wait:).*|\1 1s|" \
        -e "s|^([[:space:]]*group_interval:).*|\1 5s|" \
        -e "s|^([[:space:]]*resolve_timeout:).*|\1 1m|" \
        "$REPO_ROOT/conf/alertmanager/slurm-gpu.yml" | write_if_changed "$STATE/etc/alertmanager.yml"
    chmod 644 "$STATE/etc/alertmanager.yml"
}

# http_post URL: POSTs nothing to URL, succeeds on 2xx (Alertmanager's /-/reload).
http_post() {
    /usr/bin/python3 -c 'import sys, urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b"", method="POST"), timeout=5)' "$1"
}

# start_alertmanager: Alertmanager for the running Prometheus. It runs under a small bash
# watcher (the pid in run/alertmanager.pid) that stops it when it gets SIGTERM or when
# Prometheus exits: lib.sh's stop_all stops Prometheus by pid, and Alertmanager goes with it.
start_alertmanager() {
    if [ ! -x "$AM_BIN" ]; then
        log "alertmanager not installed ($AM_BIN); skipping it (apt-get install prometheus-alertmanager)"
        return 0
    fi
    mkdir -p "$STATE/alertmanager" "$STATE/run" "$STATE/log"
    render_alertmanager_config
    if is_running alertmanager; then
        # A changed config is picked up without a restart.
        http_post "http://$PROM_ADDR:$AM_PORT/-/reload" 2>/dev/null || true
    else
        local as=()
        if id prometheus >/dev/null 2>&1; then
            chown -R prometheus: "$STATE/alertmanager"
            as=(runuser -u prometheus --)
        fi
        # shellcheck disable=SC2016 # the watcher's script expands its own variables.
        local watch='p=$1; shift; "$@" & c=$!; trap "kill -TERM \$c 2>/dev/null" TERM INT
while kill -0 "$p" 2>/dev/null && kill -0 "$c" 2>/dev/null; do sleep 1 & wait $!; done
kill -TERM "$c" 2>/dev/null; wait "$c"'
        # --cluster.listen-address= (empty): no gossip, so nothing listens beyond loopback.
        spawn alertmanager bash -c "$watch" alertmanager-watch "$(cat "$(pidfile prometheus)")" \
            "${as[@]}" "$AM_BIN" \
            --config.file="$STATE/etc/alertmanager.yml" \
            --storage.path="$STATE/alertmanager" \
            --web.listen-address="$PROM_ADDR:$AM_PORT" \
            --cluster.listen-address=
    fi
    wait_for alertmanager 30 http_ok "http://$PROM_ADDR:$AM_PORT/-/ready"
}

start_prometheus() {
    if [ ! -x "$PROM_BIN" ]; then
        log "prometheus not installed ($PROM_BIN); skipping it (apt-get install prometheus)"
        return 0
    fi
    mkdir -p "$STATE/prometheus" "$STATE/run" "$STATE/log"
    render_prometheus_config
    if is_running prometheus; then
        # A changed config or rules file is picked up without a restart. The pid is
        # runuser's when Prometheus runs as its user, and runuser does not pass SIGHUP on:
        # Prometheus is then its child.
        local pid kids
        pid=$(cat "$(pidfile prometheus)")
        kids=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null || true)
        # shellcheck disable=SC2086 # one word per child pid.
        kill -HUP ${kids:-$pid} 2>/dev/null || true
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
    start_alertmanager
}

# start_exporter [VENV]: `slurm-gpu exporter` on the test bed's config.
start_exporter() {
    local venv=${1:-${VENV:-${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}}}
    # local-cluster's services_up calls start_prometheus only when Prometheus is not
    # running, but this every time: on a bed whose Prometheus runs, Alertmanager and the
    # re-rendered rules and config come in here (start_prometheus starts Alertmanager
    # after Prometheus).
    if is_running prometheus; then start_prometheus; fi
    is_running slurm-gpu-exporter && return 0
    [ -x "$venv/bin/slurm-gpu" ] || die "slurm-gpu is not installed in $venv (run scripts/install-deps)"
    spawn slurm-gpu-exporter env ${SLURM_GPU_PYTHONPATH:+PYTHONPATH="$SLURM_GPU_PYTHONPATH"} \
        SLURM_GPU_CONFIG="$STATE/etc/slurm-gpu.toml" \
        SLURM_CONF="$SLURM_CONF" "$venv/bin/slurm-gpu" exporter \
        --listen "127.0.0.1:$EXPORTER_PORT"
    wait_for slurm-gpu-exporter 30 http_ok "http://127.0.0.1:$EXPORTER_PORT/metrics"
}
