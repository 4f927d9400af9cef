"""The shipped alert rules under `promtool test rules`, with their production windows.

tests/data/prometheus/slurm-gpu-rules-test.yml feeds synthetic series to
conf/prometheus/slurm-gpu-rules.yml: an idle job's GPU, an agent that stops answering,
half the allocated GPUs idle, a node with a GPU fewer than Slurm configures. Each alert
must stay silent before its `for:` and fire after it with the figures in its annotations.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

PROMTOOL = "/usr/bin/promtool"
RULES_TEST = (
    Path(__file__).resolve().parents[1] / "data" / "prometheus" / "slurm-gpu-rules-test.yml"
)


def test_rules_fire_after_their_windows_with_their_figures() -> None:
    """`promtool test rules` passes on the rules' unit tests (promtool: Debian's prometheus)."""
    out = subprocess.run(
        [PROMTOOL, "test", "rules", str(RULES_TEST)], capture_output=True, text=True
    )
    assert 0 == out.returncode, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
