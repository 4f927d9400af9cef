"""`App`: the composition root. Every long-lived service of one invocation, built here.

The store, its controller records, the Slurm command runner and client, and the report
environment are built from the configuration in this one place, each on first use and
then shared, so a command that never touches Slurm starts no Slurm command and one that
never reads the store opens no connection. The CLI (slurm_gpu/cli/) holds one App per
invocation and closes it when the command ends; tests build one around their own config.

It sits above store/, slurm/, reports/ and policy/, and below cli/.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from slurm_gpu.access import Caller
from slurm_gpu.config import Config
from slurm_gpu.reports.service import ReportEnv, open_env
from slurm_gpu.slurm.client import CliSlurmClient
from slurm_gpu.slurm.runner import SlurmCommands
from slurm_gpu.store import Store
from slurm_gpu.store.control import ControlStore


class App:
    """The services of one slurm-gpu invocation, built lazily from its configuration.

    Use it as a context manager (or call `close`) so the store's connections are
    released at the end.

    Args:
        config: the effective configuration, or a function that loads it: then nothing
            is read until a service (or `config`) is first asked for, so a command can
            answer what needs no configuration (`sacct --helpformat`) with a broken one.
        caller: who runs the report commands (default: the real uid of this process).
        clock: POSIX seconds now, for the report environment.
    """

    def __init__(
        self,
        config: Config | Callable[[], Config],
        *,
        caller: Caller | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._caller = caller
        self._clock = clock

    @functools.cached_property
    def config(self) -> Config:
        """The configuration (loaded now, the first time, if the App was given a loader).

        Raises:
            ConfigError: the loader's, for a missing, unreadable or invalid config file.
        """
        return self._config if isinstance(self._config, Config) else self._config()

    @functools.cached_property
    def store(self) -> Store:
        """The accounting store of [store] url, scoped to [cluster] name."""
        config = self.config
        return Store(config.store.url, cluster=config.cluster.name, echo=config.store.echo_sql)

    @property
    def control(self) -> ControlStore:
        """The controller's records in the store (`store.control`)."""
        return self.store.control

    @functools.cached_property
    def runner(self) -> SlurmCommands:
        """Runs Slurm's commands as [slurm] says: bin_dir, command_timeout, conf."""
        slurm = self.config.slurm
        return SlurmCommands(
            bin_dir=slurm.bin_dir, timeout=float(slurm.command_timeout), conf=slurm.conf
        )

    @functools.cached_property
    def slurm(self) -> CliSlurmClient:
        """The Slurm client over `runner` (jobs, nodes, cancel, hold, associations...)."""
        return CliSlurmClient(self.runner)

    @functools.cached_property
    def report_env(self) -> ReportEnv:
        """What the report commands share: the store, Slurm, the caller's scope, now."""
        return open_env(
            self.config,
            self.store,
            self.runner,
            self.slurm,
            caller=self._caller,
            clock=self._clock,
        )

    def close(self) -> None:
        """Release the store's connections, if a store was opened."""
        if "store" in self.__dict__:
            self.store.dispose()

    def __enter__(self) -> App:
        """The App itself; leaving the block closes it."""
        return self

    def __exit__(self, *_exc: object) -> None:
        """Close the App."""
        self.close()
