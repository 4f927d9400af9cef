"""The one place slurm-gpu runs Slurm commands: timeouts, errors, and a test seam.

Every Slurm command goes through a `CommandRunner`; tests pass their own callable.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from slurm_gpu.errors import SlurmError

CommandRunner = Callable[[Sequence[str]], str]


@dataclass(frozen=True)
class SlurmCommands:
    """Runs Slurm's command-line tools.

    Args:
        bin_dir: directory of the Slurm binaries ("" = $PATH).
        timeout: seconds before a command is abandoned (slurmctld may hang).
        conf: slurm.conf path passed as SLURM_CONF ("" = Slurm's own resolution).
    """

    bin_dir: str = ""
    timeout: float = 30.0
    conf: str = ""

    def __call__(self, argv: Sequence[str]) -> str:
        """Runs argv; returns stdout. Raises SlurmError on failure or timeout."""
        program = os.path.join(self.bin_dir, argv[0]) if self.bin_dir else argv[0]
        env: Mapping[str, str] = dict(os.environ, SLURM_CONF=self.conf) if self.conf else os.environ
        try:
            done = subprocess.run(
                [program, *argv[1:]],
                capture_output=True,
                # Slurm prints job names and comments as the user wrote them, in any
                # encoding: a Latin-1 name must not make the whole listing unreadable.
                encoding="utf-8",
                errors="replace",
                timeout=self.timeout,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{argv[0]} timed out after {self.timeout:g}s") from exc
        except OSError as exc:
            raise SlurmError(f"cannot run {program}: {exc.strerror or exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmError(
                f"{' '.join(argv[:2])} failed (exit {done.returncode}): "
                + (detail[-1] if detail else "no output")
            )
        return done.stdout
