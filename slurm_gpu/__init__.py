"""slurm-gpu: GPU usage accounting and policy enforcement for Slurm clusters."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("slurm-gpu")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
