"""Every error slurm-gpu raises on purpose derives from SlurmGpuError.

The CLI turns these into one clear line on stderr and a non-zero exit; anything else is a
bug and keeps its traceback.
"""


class SlurmGpuError(Exception):
    """Root of every expected slurm-gpu failure."""


class ConfigError(SlurmGpuError):
    """The configuration file is missing, unreadable or invalid.

    Attributes:
        problems: one line per problem, each naming the file and the key.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class GpuError(SlurmGpuError):
    """NVML could not be used at all (library missing, driver not loaded)."""


class SlurmError(SlurmGpuError):
    """A Slurm command failed, timed out, or printed something we cannot parse."""


class StoreError(SlurmGpuError):
    """The accounting store is unreachable or rejected a write."""
