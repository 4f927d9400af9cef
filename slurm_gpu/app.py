"""`App`: the composition root. Every long-lived service of one invocation, built here.

The store, its controller records, the Slurm command runner and client, and the report
environment are built from the configuration in this one place, each on first use and
then shared, so a command that never touches Slurm starts no Slurm command and one that
never reads the store opens no connection. The CLI (slurm_gpu/cli/) holds one App per
invocation and closes it when the command ends; tests build one around their own config.

Who may do what is decided here too (slurm_gpu/access.py): `scope` is the caller's, for
every command that shows jobs; `require_admin` refuses a command before any store is
opened; and opening the store is the moment a setgid users' command gives its group up.

It sits above store/, slurm/, reports/ and policy/, and below cli/.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence

from slurm_gpu.access import (
    Caller,
    Scope,
    T,
    current_caller,
    give_up_group,
    resolve_scope,
    visible,
)
from slurm_gpu.access import require_admin as refuse_unless_admin
from slurm_gpu.config import Config
from slurm_gpu.errors import StoreError
from slurm_gpu.reports.quota import quota_used
from slurm_gpu.reports.service import ReportEnv, open_env
from slurm_gpu.reports.status import Freshness
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
        caller: who runs the command (default: the real uid of this process).
        clock: POSIX seconds now, for the report environment.
        give_up_group: given a function that opens the store, drops a setgid program's
            group after it (`access.give_up_group`); tests pass their own.
    """

    def __init__(
        self,
        config: Config | Callable[[], Config],
        *,
        caller: Caller | None = None,
        clock: Callable[[], float] = time.time,
        give_up_group: Callable[[Callable[[], object]], bool] = give_up_group,
    ) -> None:
        self._config = config
        self._caller = caller
        self._clock = clock
        self._give_up_group = give_up_group

    @functools.cached_property
    def config(self) -> Config:
        """The configuration (loaded now, the first time, if the App was given a loader).

        Raises:
            ConfigError: the loader's, for a missing, unreadable or invalid config file.
        """
        return self._config if isinstance(self._config, Config) else self._config()

    @functools.cached_property
    def caller(self) -> Caller:
        """Who runs this command: the one given, else the process's real uid."""
        return self._caller if self._caller is not None else current_caller()

    @functools.cached_property
    def scope(self) -> Scope:
        """What the caller may see ([access] admins, Slurm's roles if [access] slurm_roles).

        root sees everything without the config being read (`db upgrade --url` works
        with a broken one).
        """
        if self.caller.uid == 0:
            return resolve_scope(self.caller, None)
        access = self.config.access
        return resolve_scope(
            self.caller, self.slurm, admins=access.admins, use_slurm=access.slurm_roles
        )

    def require_admin(self, command: str) -> None:
        """Refuse `command` unless the caller is an admin; opens no store.

        Raises:
            NotAnAdmin: the caller is not root, the SlurmUser, in [access] admins, or a
                Slurm Operator or Administrator.
        """
        refuse_unless_admin(self.scope, command)

    def visible(self, records: Sequence[T]) -> list[T]:
        """The records about jobs (audit entries) that the caller may see (`scope`).

        One without a user is judged by its job's owner in the store.
        """
        return visible(self.scope, records, self._job_owner)

    def _job_owner(self, job_id: int) -> tuple[str, str] | None:
        job = self.store.job(job_id)
        return (job.get("user") or "", job.get("account") or "") if job else None

    @functools.cached_property
    def store(self) -> Store:
        """The accounting store of [store] url, scoped to [cluster] name.

        A setgid process (the users' command) connects it, then gives its group up: the
        group was needed only to read the config and open the store (a SQLite file in a
        folder of the group's), and nothing the user asks for afterwards runs with it.
        """
        config = self.config
        store = Store(config.store.url, cluster=config.cluster.name, echo=config.store.echo_sql)
        self._give_up_group(functools.partial(_connect, store))
        return store

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
            caller=self.caller,
            scope=self.scope,
            clock=self._clock,
        )

    def quota_meter(self, scope: str, unit: str, since: float, until: float, now: float) -> float:
        """What a [[quota]] scope used, as the bill counts it (reports/quota.py)."""
        lag = Freshness.of(self.config, now).interval_lag
        return quota_used(self.store, scope, unit, since, until, now=now, lag=lag)

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


def _connect(store: Store) -> None:
    """Open the store's first connection; it stays in the pool for the command's queries."""
    # When it fails, the command's own first query says what is wrong, in its own words.
    with contextlib.suppress(StoreError):
        store.ping()
