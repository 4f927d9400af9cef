"""Alarms through the real Alertmanager: a real condition on the test bed, mail and Slack.

The test bed runs Debian's Prometheus and prometheus-alertmanager on loopback
(docker/slurm-cluster/prometheus.sh): Prometheus evaluates conf/prometheus/slurm-gpu-rules.yml
with short windows (every `for:` 10 s) and sends to Alertmanager, whose config is
conf/alertmanager/slurm-gpu.yml delivering on loopback with seconds for minutes. Here the
test's own SMTP server and HTTP server (tests/receivers.py) take the place of the mail
relay and of Slack's incoming webhook: the module writes the bed's rendered config with
their addresses, reloads Alertmanager (POST /-/reload), and restores the config after.

- An idle job kept on the simulated GPUs (`gpu-load --pattern idle`) raises
  SlurmGpuIdleAllocated; its FIRING line reaches both receivers, and a RESOLVED line for
  it follows once the job is cancelled (send_resolved).
- gpu1's node agent stopped raises SlurmGpuAgentDown (critical), resolved after the agent
  starts again.

The bed is shared and may hold other alerts (other idle jobs, other groups): every check
looks for the lines about this test's own job or agent only.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from tests.integration.testbed import REPO_ROOT, TestBed
from tests.receivers import smtp_receiver, webhook_receiver

AMTOOL = "/usr/bin/amtool"
SHIPPED = REPO_ROOT / "conf" / "alertmanager" / "slurm-gpu.yml"


def wait_until(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def post(url: str) -> None:
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def mail_text(message: Message) -> str:
    """The text/plain part (Alertmanager sends it beside its HTML)."""
    for part in message.walk():
        if part.get_content_type() == "text/plain":
            payload = part.get_payload(decode=True)
            assert isinstance(payload, bytes)
            return payload.decode()
    return ""


@dataclass
class Alerting:
    """The bed's Alertmanager, delivering to this module's receivers."""

    url: str
    prometheus: str
    mails: list[Message]
    posts: list[dict[str, Any]]

    def mail_lines(self, since: int = 0) -> list[tuple[str, str]]:
        """(Subject, line) of every line of every mail received after the first `since`."""
        return [
            (str(m["Subject"]), line)
            for m in self.mails[since:]
            for line in mail_text(m).splitlines()
        ]

    def slack_lines(self, since: int = 0) -> list[tuple[str, str]]:
        """(title, line) of every line of every Slack attachment received after `since`."""
        return [
            (str(a.get("title")), line)
            for p in self.posts[since:]
            for a in p.get("attachments", [])
            for line in str(a.get("text", "")).splitlines()
        ]

    def active(self, alertname: str) -> list[dict[str, Any]]:
        """Alertmanager's active alerts of that name."""
        query = urllib.parse.urlencode({"filter": f'alertname="{alertname}"', "active": "true"})
        return list(get_json(f"{self.url}/api/v2/alerts?{query}"))


def both_received(
    alerting: Alerting, pattern: str, since: tuple[int, int] = (0, 0)
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]] | None:
    """The mail and Slack lines matching `pattern`, once both receivers have one."""
    regex = re.compile(pattern)
    mails = [m for m in alerting.mail_lines(since[0]) if regex.search(m[1])]
    slack = [s for s in alerting.slack_lines(since[1]) if regex.search(s[1])]
    return (mails, slack) if mails and slack else None


@pytest.fixture(scope="module")
def alerting(testbed: TestBed) -> Iterator[Alerting]:
    """The bed's Alertmanager pointed at an SMTP and a webhook receiver of this module."""
    etc = testbed.state_dir / "etc"
    prom_config = (etc / "prometheus.yml").read_text()
    match = re.search(
        r"alertmanagers:\s*- static_configs:\s*- targets: \[\"([^\"]+)\"\]", prom_config
    )
    assert match, f"no Alertmanager in the bed's {etc / 'prometheus.yml'}"
    am_url = f"http://{match[1]}"
    prom_port = re.search(r"--web.listen-address=\S+:(\d+)", _cmdline(testbed, "prometheus"))
    assert prom_port, "the bed's Prometheus command line names no listen address"
    config_path = etc / "alertmanager.yml"
    original = config_path.read_text()
    with smtp_receiver() as (smtp_port, mails), webhook_receiver() as (hook_url, posts):
        ours = re.sub(
            r"^(\s*smtp_smarthost:).*$",
            rf'\1 "127.0.0.1:{smtp_port}"',
            original,
            count=1,
            flags=re.MULTILINE,
        )
        ours = re.sub(
            r"^(\s*- api_url:).*$", rf'\1 "{hook_url}"', ours, count=1, flags=re.MULTILINE
        )
        assert str(smtp_port) in ours and hook_url in ours
        _write(config_path, ours)
        try:
            post(f"{am_url}/-/reload")
            loaded = get_json(f"{am_url}/api/v2/status")["config"]["original"]
            # (the status shows the Slack URL as <secret>)
            assert f"smtp_smarthost: 127.0.0.1:{smtp_port}" in loaded
            yield Alerting(am_url, f"http://127.0.0.1:{prom_port[1]}", mails, posts)
        finally:
            _write(config_path, original)
            post(f"{am_url}/-/reload")


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(path)


def _cmdline(testbed: TestBed, daemon: str) -> str:
    """The command line of a bed daemon (or of its child, under runuser)."""
    pid = (testbed.state_dir / "run" / f"{daemon}.pid").read_text().strip()
    lines = [Path(f"/proc/{pid}/cmdline").read_bytes()]
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    lines += [Path(f"/proc/{child}/cmdline").read_bytes() for child in children]
    return " ".join(b.replace(b"\0", b" ").decode() for b in lines)


def test_shipped_alertmanager_config_passes_amtool() -> None:
    """conf/alertmanager/slurm-gpu.yml passes `amtool check-config`, two receivers found."""
    out = subprocess.run([AMTOOL, "check-config", str(SHIPPED)], capture_output=True, text=True)
    assert 0 == out.returncode, out.stdout + out.stderr
    assert "2 receivers" in out.stdout


def test_idle_job_alert_reaches_mail_and_slack_then_resolves(
    testbed: TestBed, alerting: Alerting, cancel_after: list[int]
) -> None:
    """An idle GPU job fires SlurmGpuIdleAllocated to mail and Slack; RESOLVED after it ends."""
    job = testbed.submit(
        "alice",
        "--gres=gpu:1",
        "--time=5",
        wrap=testbed.gpu_load("--pattern", "idle", "--seconds", "300"),
    )
    cancel_after.append(job)
    testbed.wait_state(job, {"RUNNING"}, timeout=120)
    node, _ = testbed.job_gpus(job)
    about_job = rf"SlurmGpuIdleAllocated: Job {job} \(alice/\w+\) keeps GPU \S+ on {node} idle"

    mails, slack = wait_until(
        f"the idle alert of job {job} by mail and Slack",
        lambda: both_received(alerting, rf"^FIRING \[warning\] {about_job}$"),
        120,
    )
    assert f"[slurm-gpu] FIRING: SlurmGpuIdleAllocated on {node}" in mails[0][0]
    assert f"FIRING: SlurmGpuIdleAllocated on {node}" == slack[0][0]

    testbed.run("scancel", str(job))
    wait_until(
        f"the idle alert of job {job} resolved, by mail and Slack",
        lambda: both_received(alerting, rf"^RESOLVED \[warning\] {about_job}$"),
        120,
    )


def test_agent_stopped_alert_reaches_mail_and_slack_then_resolves(
    testbed: TestBed, alerting: Alerting
) -> None:
    """gpu1's agent stopped fires SlurmGpuAgentDown (critical); RESOLVED once it runs again."""
    agent_gpu1 = testbed.metrics_address("gpu1")

    def agent_up() -> bool:
        query = urllib.parse.urlencode({"query": f'up{{instance="{agent_gpu1}"}} == 1'})
        answer = get_json(f"{alerting.prometheus}/api/v1/query?{query}")
        no_alert = not [
            a
            for a in alerting.active("SlurmGpuAgentDown")
            if a["labels"].get("instance") == agent_gpu1
        ]
        return bool(answer["data"]["result"]) and no_alert

    # Another test may have left gpu1's agent just restarted: start from an agent that is up.
    wait_until("gpu1's agent up and no agent-down alert for it", agent_up, 90)
    since = (len(alerting.mails), len(alerting.posts))
    about_agent = rf"SlurmGpuAgentDown: slurm-gpu node agent {re.escape(agent_gpu1)} is down"
    testbed.launcher("agent", "stop", "gpu1")
    try:
        mails, slack = wait_until(
            "the agent-down alert by mail and Slack",
            lambda: both_received(alerting, rf"^FIRING \[critical\] {about_agent}$", since),
            120,
        )
        assert "[slurm-gpu] FIRING: SlurmGpuAgentDown" in mails[0][0]
        assert slack[0][0].startswith("FIRING: SlurmGpuAgentDown")
    finally:
        testbed.launcher("agent", "start", "gpu1")
    wait_until(
        "the agent-down alert resolved, by mail and Slack",
        lambda: both_received(alerting, rf"^RESOLVED \[critical\] {about_agent}$", since),
        120,
    )
