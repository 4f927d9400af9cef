"""The soak, shortened: random workload with every fault injected, zero loss at the end."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.integration.testbed import REPO_ROOT, TestBed

SOAK_SECONDS = 150


def test_short_soak_loses_nothing_and_wrongs_nobody(testbed: TestBed) -> None:
    """bench/soak over 150 s: every loss and error counter is zero; readings all stored."""
    done = subprocess.run(
        [str(REPO_ROOT / "bench" / "soak"), str(SOAK_SECONDS)],
        env=testbed.env,
        capture_output=True,
        text=True,
        timeout=SOAK_SECONDS + 900,
        check=False,
    )
    report = done.stdout + done.stderr
    (Path(testbed.state_dir) / "log" / "soak-ci.txt").write_text(report)
    counters = {
        line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1]
        for line in done.stdout.splitlines()
        if line.startswith("  ")
        and not line.strip().startswith(
            ("peak", "store", "agent", "slurmctld", "gpu", "controller", "collector", "link")
        )
    }
    zero = [
        "jobs without a summary",
        "GPU summaries with lost readings",
        "missing data outside fault windows",
        "duplicate readings",
        "jobs wrongly cancelled (busy by ground truth)",
        "cancellations not in the audit log",
        "nodes drained wrongly",
    ]
    assert {k: counters.get(k) for k in zero} == dict.fromkeys(zero, "0"), report
    assert "1" == counters.get("lost GPU drained its node (expected 1)"), report
    assert int(counters["jobs that ran on GPUs"]) >= 10, report
    assert done.stdout.strip().splitlines()[-1].endswith(" ok"), report
