"""SlurmClient: what slurm-gpu asks of Slurm, and the CLI backend that asks it.

Every command goes through one `CommandRunner` (production: `SlurmCommands`, with its
timeout); tests pass their own. Parsing lives in squeue.py, scontrol.py and sacctmgr.py
as pure functions; code outside slurm/ asks this client and never reads Slurm's text.
Records the parsers could not read are skipped, logged and kept in
`CliSlurmClient.problems` (of the last call), never turned into guesses.

Works with every Slurm since 21.08: `squeue --json` when it works, else a fixed
`squeue -O` format with control-character separators; `sacctmgr -n -P`; `scontrol`.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from slurm_gpu.errors import SlurmError
from slurm_gpu.models import SlurmJob
from slurm_gpu.slurm import sacctmgr, scontrol, squeue
from slurm_gpu.slurm.runner import CommandRunner, SlurmCommands
from slurm_gpu.slurm.sacctmgr import Association
from slurm_gpu.slurm.scontrol import GpuNode, NodeInfo
from slurm_gpu.slurm.squeue import JobOwner

log = logging.getLogger(__name__)

REASON_PREFIX = "slurm-gpu: "
DEFAULT_STATES = ("RUNNING", "PENDING")


@runtime_checkable
class SlurmClient(Protocol):
    """What slurm-gpu needs from Slurm. Every method raises SlurmError on failure.

    Per-job actions on many jobs (cancel, hold, release) return {job_id: error text or
    None}: one failing job does not stop the others.
    """

    def jobs(self, states: Sequence[str] = DEFAULT_STATES) -> list[SlurmJob]:
        """Jobs in these states, running ones with their GPU indices per node."""
        ...

    def cancel(self, job_ids: Iterable[int], reason: str) -> dict[int, str | None]:
        """Records `slurm-gpu: <reason>` in each AdminComment, then scancels the job."""
        ...

    def hold(self, job_ids: Iterable[int], reason: str) -> dict[int, str | None]:
        """Records the reason in each AdminComment, then holds the (pending) job."""
        ...

    def release(self, job_ids: Iterable[int]) -> dict[int, str | None]:
        """Releases held jobs."""
        ...

    def set_time_limit(self, job_id: int, seconds: float) -> None:
        """Sets the job's time limit (rounded up to whole minutes, Slurm's unit)."""
        ...

    def set_comment(self, job_id: int, text: str) -> None:
        """Sets the job's (user-visible) Comment."""
        ...

    def set_qos(self, job_id: int, qos: str) -> None:
        """Moves the job to another QOS."""
        ...

    def associations(
        self, user: str | None = None, account: str | None = None
    ) -> list[Association]:
        """Associations with their limits and shares."""
        ...

    def set_association(self, account: str, user: str | None = None, **fields: object) -> None:
        """Changes an account's (or a user's in that account) association fields."""
        ...

    def drain(self, node: str, reason: str) -> None:
        """Drains a node with a reason."""
        ...

    def resume(self, node: str) -> None:
        """Returns a drained node to service."""
        ...

    def nodes(self) -> list[NodeInfo]:
        """Compute nodes, their state, drain reason and GRES."""
        ...

    def ping(self) -> None:
        """Returns when slurmctld answers; raises SlurmError otherwise."""
        ...

    def gpu_nodes(self) -> list[GpuNode]:
        """Every node's state and its configured and allocated GPUs."""
        ...

    def running_owners(self) -> dict[int, JobOwner]:
        """{job_id: owner} of the running and completing jobs."""
        ...

    def slurm_user(self) -> str:
        """The SlurmUser slurmctld runs as ("" when the configuration does not say)."""
        ...

    def admin_levels(self) -> dict[str, str]:
        """{user: AdminLevel} ("None", "Operator", "Administrator")."""
        ...

    def coordinators(self) -> dict[str, set[str]]:
        """{account: coordinator users}."""
        ...


def merge_reason(existing: str, reason: str) -> str:
    """The AdminComment with our reason added: anything already there is kept.

    A reason already present is not repeated. Newlines become spaces (AdminComment is
    shown on one line by sacct).
    """
    text = REASON_PREFIX + " ".join(reason.split())
    existing = existing.strip()
    if not existing:
        return text
    if text in existing:
        return existing
    return f"{existing}; {text}"


class CliSlurmClient:
    """SlurmClient over Slurm's command-line tools.

    Args:
        run: the command runner (default SlurmCommands(): $PATH, 30 s timeout).
        tz: time zone of the times squeue prints (default: this process's local zone).
        use_json: True/False to force or forbid `squeue --json`; None tries it and falls
            back to `squeue -O` for good once --json fails where -O works.
    """

    def __init__(
        self,
        run: CommandRunner | None = None,
        *,
        tz: dt.tzinfo | None = None,
        use_json: bool | None = None,
    ) -> None:
        self._run: CommandRunner = run if run is not None else SlurmCommands()
        self._tz = tz
        self._use_json = use_json
        self.problems: list[str] = []
        """What the last call skipped or doubted (one line each); also logged."""

    # --- jobs -----------------------------------------------------------------------

    def jobs(self, states: Sequence[str] = DEFAULT_STATES) -> list[SlurmJob]:
        """Jobs in `states` (all when empty), with GPU indices per node when running.

        `squeue --json` (or `squeue -O`), then one `scontrol -d show job` for all running
        jobs that have GPUs (`squeue` does not say which GPU indices a job holds).
        """
        self.problems = []
        listing = self._squeue(tuple(s.upper() for s in states))
        names = {job.job_id: job.name for job in listing.jobs}
        wanted = {job.job_id for job in listing.jobs if job.state == "RUNNING" and job.gpu_count}
        details: dict[int, scontrol.NodeGpus] = {}
        if wanted:
            try:
                details, problems = scontrol.parse_job_gpu_details(
                    self._run(["scontrol", "-d", "show", "job"]), names
                )
                self._report([p for p in problems if _job_of(p) in wanted])
            except SlurmError as exc:
                self._report([f"scontrol -d show job failed: {exc}"])
        jobs: list[SlurmJob] = []
        for job in listing.jobs:
            if job.job_id in wanted:
                gpus = details.get(job.job_id)
                if gpus is None:
                    gpus = scontrol.gpus_from_gres_detail(
                        job.nodes, listing.gres_detail.get(job.job_id, ())
                    )
                job = self._checked_gpus(job, gpus)
            jobs.append(job)
        return jobs

    def _checked_gpus(self, job: SlurmJob, gpus: scontrol.NodeGpus | None) -> SlurmJob:
        if gpus is None:
            self._report([f"job {job.job_id}: no GPU detail from scontrol; GPUs unknown"])
            return job
        held = sum(len(indices) for _, indices in gpus)
        strangers = {node for node, _ in gpus} - set(job.nodes)
        if held != job.gpu_count or strangers:
            self._report(
                [
                    f"job {job.job_id}: scontrol shows {held} GPUs on "
                    f"{[n for n, _ in gpus]}, squeue {job.gpu_count} on {list(job.nodes)}; "
                    "GPUs unknown"
                ]
            )
            return job
        return squeue.with_gpus(job, gpus)

    def _squeue(self, states: Sequence[str]) -> squeue.SqueueResult:
        result: squeue.SqueueResult | None = None
        json_error: SlurmError | None = None
        if self._use_json is not False:
            try:
                result = squeue.parse_squeue_json(self._run(["squeue", "--json"]), states, self._tz)
            except SlurmError as exc:
                if self._use_json:
                    raise
                json_error = exc
        if result is None:
            result = squeue.parse_squeue_format(
                self._run(squeue.format_argv(states)), states, self._tz
            )
            if json_error is not None:
                log.info("squeue --json unusable (%s); using squeue -O from now on", json_error)
                self._use_json = False
        self._report(result.problems)
        return result

    def _report(self, problems: Iterable[str]) -> None:
        for problem in problems:
            log.warning("%s", problem)
            self.problems.append(problem)

    # --- per-job actions ----------------------------------------------------------------

    def _lookup(self, job_ids: Iterable[int]) -> tuple[dict[int, SlurmJob], dict[int, str]]:
        listing = self._squeue(())
        by_id = {job.job_id: job for job in listing.jobs}
        return {i: by_id[i] for i in job_ids if i in by_id}, listing.targets

    def _annotate_then(
        self, job_ids: Iterable[int], reason: str, action: Callable[[str], list[str]]
    ) -> dict[int, str | None]:
        """AdminComment first (so the reason is on record), then `action(target)`."""
        self.problems = []
        ids = list(dict.fromkeys(job_ids))
        found, targets = self._lookup(ids)
        results: dict[int, str | None] = {}
        for job_id in ids:
            job = found.get(job_id)
            if job is None:
                results[job_id] = f"job {job_id} not found by squeue (finished or unknown)"
                continue
            if job.state not in squeue.ACTIVE_STATES:
                results[job_id] = f"job {job_id} is already {job.state}"
                continue
            target = targets.get(job_id, str(job_id))
            comment = merge_reason(job.admin_comment, reason)
            try:
                self._run(["scontrol", "update", f"JobId={target}", f"AdminComment={comment}"])
            except SlurmError as exc:
                results[job_id] = f"AdminComment not set, nothing done: {exc}"
                continue
            try:
                self._run(action(target))
            except SlurmError as exc:
                results[job_id] = str(exc)
                continue
            results[job_id] = None
        return results

    def cancel(self, job_ids: Iterable[int], reason: str) -> dict[int, str | None]:
        """`scontrol update JobId=N AdminComment=...; slurm-gpu: <reason>`, then `scancel`.

        Array tasks are named `<array>_<task>` (scancel of the array's id would cancel
        every task). A job whose AdminComment cannot be set is not cancelled.
        """
        return self._annotate_then(job_ids, reason, lambda target: ["scancel", target])

    def hold(self, job_ids: Iterable[int], reason: str) -> dict[int, str | None]:
        """Reason into the AdminComment, then `scontrol hold` (pending jobs only)."""
        return self._annotate_then(job_ids, reason, lambda target: ["scontrol", "hold", target])

    def release(self, job_ids: Iterable[int]) -> dict[int, str | None]:
        """`scontrol release` per job."""
        self.problems = []
        ids = list(dict.fromkeys(job_ids))
        found, targets = self._lookup(ids)
        results: dict[int, str | None] = {}
        for job_id in ids:
            if job_id not in found:
                results[job_id] = f"job {job_id} not found by squeue (finished or unknown)"
                continue
            try:
                self._run(["scontrol", "release", targets.get(job_id, str(job_id))])
                results[job_id] = None
            except SlurmError as exc:
                results[job_id] = str(exc)
        return results

    def _update(self, job_id: int, setting: str) -> None:
        self.problems = []
        found, targets = self._lookup([job_id])
        if job_id not in found:
            raise SlurmError(f"scontrol update: job {job_id} not found by squeue")
        self._run(["scontrol", "update", f"JobId={targets.get(job_id, job_id)}", setting])

    def set_time_limit(self, job_id: int, seconds: float) -> None:
        """`scontrol update JobId=N TimeLimit=<minutes>` (rounded up, at least 1)."""
        if not math.isfinite(seconds) or seconds <= 0:
            raise SlurmError(f"set_time_limit: bad time limit {seconds!r} for job {job_id}")
        self._update(job_id, f"TimeLimit={max(1, math.ceil(seconds / 60))}")

    def set_comment(self, job_id: int, text: str) -> None:
        """`scontrol update JobId=N Comment=<text>` (newlines become spaces)."""
        self._update(job_id, "Comment=" + " ".join(text.split()))

    def set_qos(self, job_id: int, qos: str) -> None:
        """`scontrol update JobId=N QOS=<qos>`."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", qos):
            raise SlurmError(f"set_qos: bad QOS name {qos!r}")
        self._update(job_id, f"QOS={qos}")

    # --- associations ---------------------------------------------------------------

    def associations(
        self, user: str | None = None, account: str | None = None
    ) -> list[Association]:
        """`sacctmgr -n -P show assoc [where user= account=] format=...`."""
        self.problems = []
        found, problems = sacctmgr.parse_associations(self._run(sacctmgr.assoc_argv(user, account)))
        self._report(problems)
        return found

    def set_association(self, account: str, user: str | None = None, **fields: object) -> None:
        """`sacctmgr -i modify user|account where ... set Field=value ...`.

        E.g. GrpTRES="gres/gpu=0" blocks GPU jobs; GrpTRES="gres/gpu=-1" clears the
        limit; Fairshare=10 (or Shares=10) sets the raw shares.

        Raises:
            SlurmError: unknown field, bad value, or sacctmgr matched nothing.
        """
        self.problems = []
        out = self._run(sacctmgr.modify_assoc_argv(account, user, fields))
        if "nothing modified" in out.lower():
            who = f"user {user} in account {account}" if user else f"account {account}"
            raise SlurmError(f"sacctmgr modify: nothing modified for {who}")

    def admin_levels(self) -> dict[str, str]:
        """`sacctmgr -n -P show user format=User,AdminLevel`."""
        self.problems = []
        levels, problems = sacctmgr.parse_admin_levels(self._run(sacctmgr.ADMIN_LEVEL_ARGV))
        self._report(problems)
        return levels

    def coordinators(self) -> dict[str, set[str]]:
        """`sacctmgr -n -P show account withcoord format=Account,Coordinators`."""
        self.problems = []
        accounts, problems = sacctmgr.parse_coordinators(self._run(sacctmgr.COORDINATOR_ARGV))
        self._report(problems)
        return accounts

    # --- nodes and the controller -------------------------------------------------------

    def drain(self, node: str, reason: str) -> None:
        """`scontrol update NodeName=<node> State=DRAIN Reason="slurm-gpu: <reason>"`."""
        text = REASON_PREFIX + " ".join(reason.split())
        self._run(
            ["scontrol", "update", f"NodeName={_node(node)}", "State=DRAIN", f"Reason={text}"]
        )

    def resume(self, node: str) -> None:
        """`scontrol update NodeName=<node> State=RESUME`."""
        self._run(["scontrol", "update", f"NodeName={_node(node)}", "State=RESUME"])

    def nodes(self) -> list[NodeInfo]:
        """`sinfo -h -N -o ...`: one NodeInfo per node."""
        self.problems = []
        found, problems = scontrol.parse_sinfo_nodes(self._run(scontrol.sinfo_argv()))
        self._report(problems)
        return found

    def ping(self) -> None:
        """`scontrol ping`; raises SlurmError unless slurmctld answers."""
        try:
            out = self._run(["scontrol", "ping"])
        except SlurmError as exc:
            raise SlurmError(f"slurmctld is not responding: {exc}") from exc
        scontrol.check_ping(out)

    def gpu_nodes(self) -> list[GpuNode]:
        """`scontrol -o show node`: one GpuNode per node (CfgTRES and AllocTRES gres/gpu)."""
        self.problems = []
        found, problems = scontrol.parse_node_gpus(self._run(scontrol.NODE_GPUS_ARGV))
        self._report(problems)
        return found

    def running_owners(self) -> dict[int, JobOwner]:
        """`squeue -h -t R,CG -o %A|%u|%a`: {job_id: JobOwner}."""
        self.problems = []
        owners, problems = squeue.parse_running_owners(self._run(squeue.OWNERS_ARGV))
        self._report(problems)
        return owners

    def slurm_user(self) -> str:
        """SlurmUser from `scontrol show config` ("SlurmUser = slurm(64030)" -> "slurm")."""
        self.problems = []
        user = scontrol.parse_slurm_user(self._run(scontrol.CONFIG_ARGV))
        if user is None:
            self._report(["scontrol show config: no SlurmUser line"])
        return user or ""


def _node(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.\[\],-]+", name):
        raise SlurmError(f"bad node name {name!r}")
    return name


def _job_of(problem: str) -> int | None:
    match = re.search(r"job (\d+)", problem)
    return int(match.group(1)) if match else None
