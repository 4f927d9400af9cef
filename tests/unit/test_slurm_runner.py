"""SlurmCommands, the one place Slurm commands run."""

from __future__ import annotations

import stat
from pathlib import Path

from slurm_gpu.slurm.runner import SlurmCommands


def test_output_that_is_not_utf8_is_read_with_replacements(tmp_path: Path) -> None:
    r"""A job name in Latin-1 (b"caf\xe9") does not make the whole listing unreadable."""
    (tmp_path / "out").write_bytes(b"JobId=1 JobName=caf\xe9\n")
    script = tmp_path / "squeue"
    script.write_text(f"#!/bin/sh\nexec cat {tmp_path / 'out'}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert "JobId=1 JobName=caf\ufffd\n" == SlurmCommands(bin_dir=str(tmp_path))(["squeue"])
