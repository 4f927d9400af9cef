"""What every report command needs: the store, Slurm, the caller's scope, the clock.

Built once per command by `slurm_gpu.app.App` around its store and Slurm runner; every
OS touchpoint (caller, command runner, clock) is an argument so tests pass their own.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

from slurm_gpu.access import Caller, Scope, current_caller, resolve_scope
from slurm_gpu.config import Config
from slurm_gpu.errors import SlurmError
from slurm_gpu.reports.status import Freshness
from slurm_gpu.reports.usage import JobFilter, Usage, load_usage
from slurm_gpu.slurm.client import SlurmClient
from slurm_gpu.slurm.runner import CommandRunner
from slurm_gpu.slurm.sacct import SacctJob, run_sacct
from slurm_gpu.store import Store


@dataclass
class ReportEnv:
    """The report commands' shared state.

    Attributes:
        config: the effective configuration.
        store: the accounting store (read-only use, except `slurm-gpu sync`).
        runner: runs Slurm commands (None: Slurm is not asked at all).
        scope: what the caller may see.
        now: the current time, aware, in the local time zone.
        warnings: things the reader should know (e.g. sacct unreachable).
    """

    config: Config
    store: Store
    runner: CommandRunner | None
    scope: Scope
    now: dt.datetime
    warnings: list[str]

    @property
    def now_seconds(self) -> float:
        """`now` as POSIX seconds."""
        return self.now.timestamp()

    @property
    def freshness(self) -> Freshness:
        """When a reading is stale, now (two [node].interval; reports/status.py)."""
        return Freshness.of(self.config, self.now_seconds)

    @property
    def tz(self) -> dt.tzinfo | None:
        """The local time zone."""
        return self.now.tzinfo

    def sacct(
        self, since: float | None, until: float | None, filters: JobFilter
    ) -> list[SacctJob] | None:
        """sacct's rows for this selection, or None (live sacct off, or Slurm failed)."""
        if self.runner is None or not self.config.reports.live_sacct:
            return None
        try:
            return run_sacct(
                self.runner,
                tz=self.tz,
                start=since,
                end=until,
                users=filters.users,
                accounts=filters.accounts,
                partitions=filters.partitions,
                jobs=filters.job_ids,
                nodes=filters.nodes,
                states=filters.states,
                all_users=True,
            )
        except SlurmError as exc:
            self.warnings.append(f"sacct failed, using the store only: {exc}")
            return None

    def usage(self, since: float | None, until: float | None, filters: JobFilter) -> Usage:
        """The jobs (and their GPUs) of this selection that the caller may see."""
        return load_usage(
            self.store,
            since=since,
            until=until,
            now=self.now_seconds,
            sacct_jobs=self.sacct(since, until, filters),
            scope=self.scope,
            filters=filters,
            cost=self.config.cost,
            lag=self.freshness.interval_lag,
        )


def open_env(
    config: Config,
    store: Store,
    runner: CommandRunner,
    slurm: SlurmClient,
    *,
    caller: Caller | None = None,
    scope: Scope | None = None,
    clock: Callable[[], float] = time.time,
) -> ReportEnv:
    """Decide the caller's scope and the time, around an open store and Slurm runner.

    Args:
        config: the configuration.
        store: the accounting store (the caller closes it: `App` does).
        runner: Slurm command runner (for sacct).
        slurm: the Slurm client over `runner` (for the caller's Slurm roles).
        caller: who is asking (default: the real uid of this process).
        scope: what the caller may see, when already decided (`App.scope`).
        clock: POSIX seconds now.
    """
    if scope is None:
        who = caller if caller is not None else current_caller()
        scope = resolve_scope(
            who,
            slurm,
            admins=config.access.admins,
            use_slurm=config.access.slurm_roles,
        )
    now = dt.datetime.fromtimestamp(clock()).astimezone()
    return ReportEnv(config, store, runner, scope, now, [])
