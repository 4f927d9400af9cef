"""Every error slurm-gpu raises on purpose derives from SlurmGpuError.

The CLI turns these into one clear line on stderr and a non-zero exit; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Callable


def brief(value: object, width: int = 40, quote: Callable[[object], str] = repr) -> str:
    """A bad value as a problem line quotes it: short, and never itself an error.

    Args:
        value: what was read.
        width: a text longer than this is cut to it, ending in "...".
        quote: how the value is written (repr; `json.dumps` for a JSON value).
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"  # str() fails past 4300 digits
    if isinstance(value, str):
        return quote(value if len(value) <= width else value[: width - 3] + "...")
    text = quote(value)
    return text if len(text) <= width else text[: width - 3] + "..."


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
