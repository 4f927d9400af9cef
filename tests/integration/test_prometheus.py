"""Prometheus on the test bed: every PromQL expression in conf/ parses and returns series.

A real Prometheus (Debian's /usr/bin/prometheus, not a fake) runs on 127.0.0.1 with a temp
config that scrapes the node agents (the bed's agent ports, TestBed.metrics_address) and a
`slurm-gpu exporter` started here on a free port, every second, and loads
conf/prometheus/slurm-gpu-rules.yml.
The job names are those of conf/prometheus/prometheus.yml (the rules use them). While a
GPU job of alice runs (so job-labelled series exist), each expression goes to
/api/v1/query and must come back with status "success" and at least one series:

- Grafana (conf/grafana/**/*.json): every panel target's `expr`, and the metric selector
  of every `label_values(...)` variable query. Grafana's variables are replaced first:
  `$__rate_interval` -> 1m, `$__interval` -> 15s, `$__range` -> 1h, and the dashboards'
  own variables ($node, $account, $user: all used as `=~` matchers) -> `.*` (their
  "All" value).
- Alert rules: the expression as written must parse (it may legitimately return nothing:
  nothing is hot or down now). Then every threshold comparison against a number
  (`> 85`, `< 5`, `== 0`) is relaxed to `> -Inf`, and `absent(X)` becomes `X`: that
  relaxed expression must return series, which proves that metric names, labels and
  joins match what the agents and the exporter really export. The rules file is written
  so that this works: each condition is "<expression> <comparison> <number>" (joined by
  and/or at most).

The per-job dashboard (conf/grafana/dashboards/slurm-gpu-job.json, issue #13) is also
checked for one real job: a job of alice on gpu2 (simulated H100s, GPM supported) driven
at `--util 90 --sm 30 --tensor 60`; with `$job_id` set to that job, every panel's query
must return series of that job, and its SM activity and tensor gauges must read what
the job did (within 3 points).

Also `promtool check rules` and `promtool check config` on the conf files.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.config import load_config
from slurm_gpu.models import Action, Verdict
from slurm_gpu.store import Store
from slurm_gpu.store.control import ControlStore
from tests.integration.testbed import REPO_ROOT, TestBed

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
RULES = REPO_ROOT / "conf" / "prometheus" / "slurm-gpu-rules.yml"
PROM_CONFIG = REPO_ROOT / "conf" / "prometheus" / "prometheus.yml"
DASHBOARDS = sorted((REPO_ROOT / "conf" / "grafana").rglob("*.json"))
JOB_DASHBOARD = REPO_ROOT / "conf" / "grafana" / "dashboards" / "slurm-gpu-job.json"
NODES = ("gpu1", "gpu2")
CLI = str(Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")) / "bin" / "slurm-gpu")
GRAFANA_VARS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
THRESHOLD = re.compile(
    r"(==|!=|>=|<=|>|<)\s*(?:bool\s+)?[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?"
)


@dataclass(frozen=True)
class Expression:
    """One PromQL expression and where it came from."""

    where: str
    expr: str
    relax: bool = False


def grafana_substitute(expr: str) -> str:
    """Grafana's built-in intervals by fixed values, dashboard variables by `.*`."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return GRAFANA_VARS.get(name, ".*")

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", one, expr)


def dashboard_expressions() -> list[Expression]:
    """Panel targets (rows' nested panels too) and label_values() variable queries."""
    found: list[Expression] = []

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        if "panels" not in board:
            continue  # not a dashboard
        for panel in panels(board["panels"]):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    where = f"{path.name}: {panel.get('title')} [{target.get('refId')}]"
                    found.append(Expression(where, grafana_substitute(target["expr"])))
        for var in board.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"\s*label_values\((.+),\s*\w+\)\s*", query)
            assert match, f"{path.name}: variable {var['name']}: unsupported query {query!r}"
            found.append(
                Expression(f"{path.name}: variable {var['name']}", grafana_substitute(match[1]))
            )
    return found


def job_dashboard_expressions(job_id: int) -> list[Expression]:
    """The per-job dashboard's panel targets with `$job_id` set to this job."""
    board = json.loads(JOB_DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\$\{job_id(?::\w+)?\}|\$job_id\b", str(job_id), target["expr"])
            where = f"{JOB_DASHBOARD.name}: {panel['title']} [{target['refId']}]"
            found.append(Expression(where, grafana_substitute(expr)))
    return found


def rule_expressions() -> list[Expression]:
    """Every rule's `expr:` line (the file keeps each expression on one line)."""
    text = RULES.read_text()
    exprs = re.findall(r"^\s*expr:\s*(.+?)\s*$", text, flags=re.MULTILINE)
    names = re.findall(r"^\s*-\s*(?:alert|record):\s*(\S+)", text, flags=re.MULTILINE)
    assert len(exprs) == len(names), "every rule needs a one-line expr"
    return [Expression(f"rule {n}", e, relax=True) for n, e in zip(names, exprs, strict=True)]


def relaxed(expr: str) -> str:
    """Threshold comparisons always true; absent(X) -> X (see the module docstring)."""
    out = THRESHOLD.sub("> -Inf", expr)
    match = re.fullmatch(r"\s*absent\((.*)\)\s*", out)
    return match[1] if match else out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def wait_until(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@dataclass
class Prometheus:
    """A running Prometheus on loopback."""

    url: str

    def query(self, expr: str) -> dict[str, Any]:
        """/api/v1/query's JSON; an HTTP error (bad expression) comes back as its body."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            return dict(get_json(url))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read() or b"{}") or {"status": f"HTTP {exc.code}"})

    def targets(self) -> list[dict[str, Any]]:
        return list(get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"])


def test_promtool_check_rules() -> None:
    """The alert rules file passes `promtool check rules`."""
    out = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert 0 == out.returncode, out.stdout + out.stderr


def test_promtool_check_config() -> None:
    """The example scrape config (and the rules it loads) passes `promtool check config`."""
    out = subprocess.run(
        [PROMTOOL, "check", "config", str(PROM_CONFIG)], capture_output=True, text=True
    )
    assert 0 == out.returncode, out.stdout + out.stderr


@pytest.fixture(scope="module")
def exporter(testbed: TestBed) -> Iterator[str]:
    """`slurm-gpu exporter` on a free port, on the test bed's store plus [cost] prices."""
    base = Path(testbed.env["SLURM_GPU_CONFIG"]).read_text()
    config = testbed.jobs_dir / f"slurm-gpu-prometheus-{os.getpid()}.toml"
    config.write_text(base + '\n[cost]\ncurrency = "EUR"\nprices = { a100 = 3.6, h100 = 7.2 }\n')
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [CLI, "--config", str(config), "exporter", "--listen", address, "--max-age", "1s"],
        env=testbed.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until("the exporter", lambda: urllib.request.urlopen(f"http://{address}/metrics"), 30)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        config.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def prometheus(
    testbed: TestBed, exporter: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    """Prometheus scraping both agents and the exporter every second, with the rules."""
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} missing: apt-get install prometheus (scripts/install-deps)")
    root = tmp_path_factory.mktemp("prometheus")
    # JSON is YAML: no YAML library needed.
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "slurm-gpu-agents",
                "static_configs": [{"targets": [testbed.metrics_address(n) for n in NODES]}],
            },
            {"job_name": "slurm-gpu-exporter", "static_configs": [{"targets": [exporter]}]},
        ],
    }
    (root / "prometheus.yml").write_text(json.dumps(config, indent=2))
    check = subprocess.run(
        [PROMTOOL, "check", "config", str(root / "prometheus.yml")], capture_output=True, text=True
    )
    assert 0 == check.returncode, check.stdout + check.stderr
    port = free_port()
    log = (root / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        wait_until("Prometheus ready", lambda: urllib.request.urlopen(f"{prom.url}/-/ready"), 60)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def live(testbed: TestBed, prometheus: Prometheus) -> Iterator[Prometheus]:
    """Targets up and a GPU job of alice running, its series scraped; cancelled after."""

    def up_nodes() -> list[str]:
        targets = prometheus.targets()
        exporter_up = any(
            t["labels"]["job"] == "slurm-gpu-exporter" and t["health"] == "up" for t in targets
        )
        nodes = [
            node
            for node in NODES
            for t in targets
            if t["scrapeUrl"].startswith(f"http://{testbed.metrics_address(node)}/")
            and t["health"] == "up"
        ]
        return nodes if exporter_up else []

    # The test bed is shared: another test may be restarting one agent right now.
    nodes = wait_until("the exporter and an agent up", up_nodes, 90)
    job = testbed.submit(
        "alice",
        "--gres=gpu:1",
        f"--nodelist={nodes[0]}",
        "--time=5",
        wrap=testbed.gpu_load("--pattern", "idle", "--seconds", "180"),
    )
    try:
        testbed.wait_state(job, {"RUNNING"}, timeout=120)
        # Controller-action series need an audit entry: a dry-run entry about our job, in
        # case the shared audit log is still empty.
        config = load_config(Path(testbed.env["SLURM_GPU_CONFIG"]))
        store = Store(config.store.url, cluster=config.cluster.name)
        try:
            control = ControlStore(store)
            if not control.audit_entries():
                verdict = Verdict(
                    "idle_gpu", Action.NONE, f"job:{job}", "test_prometheus", job_id=job
                )
                control.audit(
                    [verdict],
                    time=time.time(),
                    cycle="test_prometheus",
                    controller="test_prometheus",
                    dry_run=True,
                    outcome="dry-run",
                )
        finally:
            store.dispose()
        selector = f'slurm_gpu_utilization_percent{{job_id="{job}"}}'
        wait_until(f"series of job {job}", lambda: prometheus.query(selector)["data"]["result"], 60)
        # The agent's series come first; the exporter sees the job only at its next refresh
        # of squeue (it caches a snapshot), and the tests read its running-jobs series too.
        running = 'slurm_gpu_running_jobs{user="alice"}'
        wait_until(
            "the exporter's running jobs of alice",
            lambda: prometheus.query(running)["data"]["result"],
            60,
        )
        wait_until(
            "two samples of the exporter's counters",
            lambda: prometheus.query("count_over_time(slurm_gpu_store_up[1m]) >= 3")["data"][
                "result"
            ],
            30,
        )
        yield prometheus
    finally:
        testbed.run("scancel", str(job), check=False)


def test_rules_loaded_and_healthy(live: Prometheus) -> None:
    """Prometheus loaded every rule of the file and evaluates each without error."""
    wanted = {e.where.removeprefix("rule ") for e in rule_expressions()}

    def healthy() -> dict[str, str]:
        rules = get_json(f"{live.url}/api/v1/rules")["data"]["groups"]
        health = {
            r["name"]: r["health"] + r.get("lastError", "") for g in rules for r in g["rules"]
        }
        return health if set(health) == wanted and set(health.values()) == {"ok"} else {}

    assert wait_until("rules evaluated", healthy, 30)


@pytest.fixture(scope="module")
def h100_job(testbed: TestBed, live: Prometheus) -> Iterator[int]:
    """A job of alice on gpu2 (H100s, GPM) at util 90, SM 30, tensor 60, its GPM series scraped.

    Module-scoped, so the dashboard tests after it also run while it holds a GPM GPU.
    """
    gpu2 = testbed.metrics_address("gpu2")
    wait_until(
        "gpu2's agent up",
        lambda: [
            t
            for t in live.targets()
            if t["scrapeUrl"].startswith(f"http://{gpu2}/") and t["health"] == "up"
        ],
        90,
    )
    job = testbed.submit(
        "alice",
        "--gres=gpu:1",
        "--nodelist=gpu2",
        "--time=5",
        wrap=testbed.gpu_load("--util", "90", "--sm", "30", "--tensor", "60", "--seconds", "240"),
    )
    try:
        testbed.wait_state(job, {"RUNNING"}, timeout=120)
        selector = f'slurm_gpu_sm_active_percent{{job_id="{job}"}}'
        wait_until(f"SM activity of job {job}", lambda: live.query(selector)["data"]["result"], 60)
        yield job
    finally:
        testbed.run("scancel", str(job), check=False)


def test_job_dashboard_queries_return_series_of_the_running_job(
    live: Prometheus, h100_job: int
) -> None:
    """With Job = the H100 job, every panel of the per-job dashboard shows that job's GPU."""
    empty = []
    for expression in job_dashboard_expressions(h100_job):
        answer = live.query(expression.expr)
        assert "success" == answer.get("status"), f"{expression.expr}: {answer}"
        if not answer["data"]["result"]:
            empty.append(expression.where)
    assert [] == empty


def test_job_dashboard_reads_what_the_job_did(live: Prometheus, h100_job: int) -> None:
    """The job's SM activity and tensor gauges read its load (30% and 60%, within 3).

    The first GPM window after the job started reaches back before its load began (a
    lower mean); every full window after it reads the load, so this waits for one.
    """

    def value(metric: str) -> float:
        result = live.query(f'avg({metric}{{job_id="{h100_job}"}})')["data"]["result"]
        return float(result[0]["value"][1])

    seen: list[tuple[float, float]] = []

    def load() -> bool:
        sm, tensor = value("slurm_gpu_sm_active_percent"), value("slurm_gpu_tensor_active_percent")
        seen.append((sm, tensor))
        return abs(sm - 30) <= 3 and abs(tensor - 60) <= 3

    try:
        wait_until("the job's SM activity near 30% and tensor near 60%", load, 60)
    except AssertionError:
        raise AssertionError(f"(SM, tensor) of job {h100_job} read {seen[-3:]}") from None


@pytest.mark.parametrize("expression", dashboard_expressions(), ids=lambda e: e.where)
def test_dashboard_expression_returns_series(live: Prometheus, expression: Expression) -> None:
    """A Grafana target parses and returns at least one series on the live test bed."""
    answer = live.query(expression.expr)
    assert "success" == answer.get("status"), f"{expression.expr}: {answer}"
    assert answer["data"]["result"], f"no series: {expression.expr}"


@pytest.mark.parametrize("expression", rule_expressions(), ids=lambda e: e.where)
def test_rule_expression_parses_and_relaxed_returns_series(
    live: Prometheus, expression: Expression
) -> None:
    """An alert condition parses; with its thresholds relaxed it returns series."""
    answer = live.query(expression.expr)
    assert "success" == answer.get("status"), f"{expression.expr}: {answer}"
    loose = relaxed(expression.expr)
    assert loose != expression.expr, "an alert condition needs a threshold or absent()"
    answer = live.query(loose)
    assert "success" == answer.get("status"), f"{loose}: {answer}"
    assert answer["data"]["result"], f"no series: {loose}"


def test_exporter_exports_gpu_states_and_usage(live: Prometheus) -> None:
    """The exporter's GPU states cover both nodes; GPU-hours and cost exist for alice."""
    states = live.query("slurm_gpu_gpus")["data"]["result"]
    assert {("gpu1", s) for s in ("allocated", "idle_allocated", "free")} <= {
        (r["metric"]["node"], r["metric"]["state"]) for r in states
    }
    for expr in (
        'slurm_gpu_user_gpu_hours_total{user="alice",account="physics"}',
        'slurm_gpu_account_cost_total{account="physics",currency="EUR"}',
        'slurm_gpu_running_jobs{user="alice"}',
    ):
        assert live.query(expr)["data"]["result"], expr
