"""Exemptions in the audit log: what a policy left alone because of one, and when one ended.

`slurm-gpu exempt` writes the row of a granted exemption itself (`ControlStore.add_exemption`);
the controller adds, through the verdicts built here, a SKIP row when a job policy would
have warned, noticed, cancelled or capped a job but for an exemption (once per stretch,
as `audit_history.news` dedupes it), and an EXPIRE row once for each exemption that ended.
Pure functions of the cycle's inputs: the controller reads the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from slurm_gpu.config import Config
from slurm_gpu.models import Action, GpuActivity, GpuInterval, SlurmJob, Verdict
from slurm_gpu.policy.rules import evaluate
from slurm_gpu.store.control import EVERY_POLICY, ExemptionRecord

# What a policy would have done to an exempt job, for the audit row of the skip.
WOULD = {
    Action.WARN: "warned",
    Action.NOTICE: "sent a notice about",
    Action.CANCEL: "cancelled",
    Action.CAP_TIME: "capped",
}
EXPIRY_LOOKBACK_SECONDS = 7 * 86400.0
"""How far back the controller looks for exemptions that ended unaudited."""


def exemptions_of(job: SlurmJob, records: Iterable[ExemptionRecord]) -> list[ExemptionRecord]:
    """The `slurm-gpu exempt` exemptions covering a job (itself, its array, user, account)."""
    scopes = {f"job:{job.job_id}", f"user:{job.user}", f"account:{job.account}"}
    if job.array_job_id is not None:
        scopes.add(f"job:{job.array_job_id}")
    return [r for r in records if r.scope in scopes]


def skip_verdicts(
    jobs: Sequence[SlurmJob],
    records: Sequence[ExemptionRecord],
    activity: Sequence[GpuActivity],
    now: float,
    config: Config,
    warned: Mapping[tuple[int, str], float],
    intervals: Sequence[GpuInterval] = (),
) -> list[Verdict]:
    """SKIP verdicts: a job policy would have acted on a job but for an exemption.

    The job policies are evaluated again for the exempt jobs without the `slurm-gpu
    exempt` exemptions (the config's exempt lists still apply); each warning, notice,
    cancel or cap they give becomes one verdict naming the exemption relied on.

    Args:
        jobs: this cycle's jobs (squeue).
        records: the exemptions in force.
        activity: the cycle's GPU activity rows.
        now: the cycle's time.
        config: the loaded configuration.
        warned: the warnings of the current episodes, as the cycle evaluated with.
        intervals: the running jobs' recent GPU intervals, as the cycle evaluated with.
    """
    covered = {job.job_id: found for job in jobs if (found := exemptions_of(job, records))}
    if not covered:
        return []
    exempt_jobs = [j for j in jobs if j.job_id in covered]
    by_id = {j.job_id: j for j in exempt_jobs}
    out = []
    for v in evaluate(exempt_jobs, activity, now, config, warned=warned, intervals=intervals):
        if v.job_id is None or v.action not in WOULD:
            continue
        record = next((r for r in covered[v.job_id] if r.policy in ("", v.policy)), None)
        if record is None:
            continue
        job = by_id[v.job_id]
        out.append(
            Verdict(
                v.policy,
                Action.SKIP,
                v.target,
                f"{record.describe()}: {v.policy} skipped job {job.job_id}, which it "
                f"would have {WOULD[v.action]}. {record.reason}".rstrip(),
                job_id=job.job_id,
                user=job.user,
                account=job.account,
                details=(
                    ("exemption_id", record.id),
                    ("would", v.action.value),
                    ("until", record.until),
                ),
            )
        )
    return out


def expiry_verdicts(
    ended: Sequence[ExemptionRecord], audited: set[object], jobs: Sequence[SlurmJob]
) -> list[Verdict]:
    """EXPIRE verdicts of the exemptions that ended and have no EXPIRE row yet.

    Args:
        ended: exemptions that ended within `EXPIRY_LOOKBACK_SECONDS`.
        audited: the exemption ids that already have their EXPIRE row.
        jobs: this cycle's jobs, for the user and account of a job exemption.
    """
    by_id = {str(j.job_id): j for j in jobs}
    out = []
    for record in ended:
        if record.id in audited:
            continue
        job = by_id.get(record.target) if record.kind == "job" else None
        user = job.user if job else record.target if record.kind == "user" else ""
        account = job.account if job else record.target if record.kind == "account" else ""
        out.append(
            Verdict(
                record.policy or EVERY_POLICY,
                Action.EXPIRE,
                record.scope,
                f"{record.describe()} ended: the policies apply again.",
                job_id=int(record.target) if record.kind == "job" else None,
                user=user,
                account=account,
                details=tuple(sorted(record.details().items())),
            )
        )
    return out


def withdrawal_reason(job: SlurmJob, records: Sequence[ExemptionRecord], policy: str) -> str:
    """Why a warning of `policy` on `job` is withdrawn: the exemption, when there is one."""
    exempt = [r for r in exemptions_of(job, records) if r.policy in ("", policy)]
    if exempt:
        return f"Warning withdrawn: {exempt[0].describe()}."
    return "Warning withdrawn: the job no longer meets the policy's condition."
