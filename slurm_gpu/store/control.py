"""The controller's records in the store: audit log, exemptions, lease, notices, quota actions.

Runs its SQL through the `Store`'s public `reading()`/`writing()` transactions; the tables
came with schema revision 0002. Reach it as `store.control` (built once per store).
"""

from __future__ import annotations

import json
import time as _time_module
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from slurm_gpu.errors import StoreError
from slurm_gpu.models import Action, Verdict
from slurm_gpu.store.database import Database
from slurm_gpu.store.dialect import insert_ignore
from slurm_gpu.store.heartbeats import read_heartbeats
from slurm_gpu.store.schema import (
    audit_log,
    controller_lease,
    exemptions,
    job_gpus,
    jobs,
    notifications,
    quota_actions,
)

EVERY_POLICY = "all"
"""The audit rows' policy of an exemption from every policy."""


def audit_row(
    verdict: Verdict, *, time: float, cycle: str, controller: str, dry_run: bool, outcome: str
) -> dict[str, Any]:
    """The audit_log columns (but the cluster) of one verdict: written or spooled."""
    return {
        "time": time,
        "cycle": cycle,
        "controller": controller,
        "dry_run": dry_run,
        "policy": verdict.policy,
        "action": verdict.action.value,
        "target": verdict.target,
        "job_id": verdict.job_id,
        "user": verdict.user,
        "account": verdict.account,
        "node": verdict.node,
        "reason": verdict.reason,
        "details": json.dumps(dict(verdict.details), default=str, sort_keys=True),
        "outcome": outcome,
    }


@dataclass(frozen=True)
class AuditEntry:
    """One row of the audit log (`slurm-gpu audit`)."""

    id: int
    time: float
    cycle: str
    controller: str
    dry_run: bool
    policy: str
    action: str
    target: str
    job_id: int | None
    user: str
    account: str
    node: str
    reason: str
    details: dict[str, Any]
    outcome: str


@dataclass(frozen=True)
class ExemptionRecord:
    """An admin's exemption: kind "job", "user" or "account"; policy "" = every policy."""

    id: int
    kind: str
    target: str
    policy: str
    until: float
    reason: str
    created_by: str
    created_at: float

    @property
    def scope(self) -> str:
        """What is exempt, as audit targets and `Exemption.scope` spell it: "job:123"."""
        return f"{self.kind}:{self.target}"

    def describe(self) -> str:
        """For audit reasons: "Exemption 3 of job 123 from idle_gpu until 2024-06-01 14:00"."""
        until = _time_module.strftime("%Y-%m-%d %H:%M:%S", _time_module.localtime(self.until))
        return (
            f"Exemption {self.id} of {self.kind} {self.target} from "
            f"{self.policy or 'every policy'} until {until} (by {self.created_by})"
        )

    def details(self) -> dict[str, Any]:
        """The figures its audit rows carry."""
        return {
            "exemption_id": self.id,
            "until": self.until,
            "created_by": self.created_by,
            "exemption_reason": self.reason,
        }


@dataclass(frozen=True)
class QuotaAction:
    """Something the quota policy set through Slurm and has not undone yet."""

    scope: str
    action: str
    target: str
    applied_at: float
    details: dict[str, Any]


@dataclass(frozen=True)
class HistoricJob:
    """A job as the store recorded it (hooks' events, `slurm-gpu sync`), for backtests."""

    job_id: int
    user: str
    account: str
    partition: str
    name: str
    start: float
    end: float | None
    gpus: int
    nodes: tuple[str, ...]


class ControlStore:
    """Controller bookkeeping on top of a Store (same database, same cluster).

    Args:
        store: the accounting store; use its `control` attribute rather than building
            another.
    """

    def __init__(self, store: Database) -> None:
        self.store = store
        self.cluster = store.cluster

    # ---- audit ----------------------------------------------------------------------

    def audit(
        self,
        verdicts: Sequence[Verdict],
        *,
        time: float,
        cycle: str,
        controller: str,
        dry_run: bool,
        outcome: str,
    ) -> list[int]:
        """Writes verdicts to the audit log (before acting); returns their ids."""
        return self.audit_rows(
            [
                audit_row(
                    v, time=time, cycle=cycle, controller=controller, dry_run=dry_run,
                    outcome=outcome,
                )
                for v in verdicts
            ]
        )  # fmt: skip

    def audit_rows(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        """Writes audit rows as `audit_row` builds them (the controller's spool); their ids."""
        ids: list[int] = []
        if not rows:
            return ids
        with self.store.writing(f"auditing {len(rows)} decisions") as conn:
            for row in rows:
                result = conn.execute(audit_log.insert().values(cluster=self.cluster, **row))
                ids.append(_new_id(result))
        return ids

    def set_outcome(self, audit_id: int, outcome: str) -> None:
        """Records what acting on an audited verdict did ("done", "failed: ...")."""
        with self.store.writing("recording an action's outcome") as conn:
            conn.execute(
                audit_log.update().where(audit_log.c.id == audit_id).values(outcome=outcome[:255])
            )

    def note_details(self, audit_id: int, **details: object) -> None:
        """Adds figures to an audited decision after the fact (whom its message reached)."""
        c = audit_log.c
        with self.store.writing("noting what came of a decision") as conn:
            row = conn.execute(sa.select(c.details).where(c.id == audit_id)).first()
            if row is None:
                return
            merged = {**json.loads(row.details or "{}"), **details}
            conn.execute(
                audit_log.update()
                .where(c.id == audit_id)
                .values(details=json.dumps(merged, default=str, sort_keys=True))
            )

    def audit_entries(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        users: Sequence[str] = (),
        accounts: Sequence[str] = (),
        job_ids: Sequence[int] = (),
        policies: Sequence[str] = (),
        actions: Sequence[str] = (),
        dry_run: bool | None = None,
    ) -> list[AuditEntry]:
        """Audit rows matching every given filter, oldest first."""
        c = audit_log.c
        query = sa.select(audit_log).where(c.cluster == self.cluster)
        if since is not None:
            query = query.where(c.time >= since)
        if until is not None:
            query = query.where(c.time < until)
        for column, values in (
            (c.user, users),
            (c.account, accounts),
            (c.job_id, job_ids),
            (c.policy, policies),
            (c.action, actions),
        ):
            if values:
                query = query.where(column.in_(list(values)))
        if dry_run is not None:
            query = query.where(c.dry_run == dry_run)
        with self.store.reading("reading the audit log") as conn:
            return [
                AuditEntry(
                    id=r["id"],
                    time=r["time"],
                    cycle=r["cycle"],
                    controller=r["controller"],
                    dry_run=bool(r["dry_run"]),
                    policy=r["policy"],
                    action=r["action"],
                    target=r["target"],
                    job_id=r["job_id"],
                    user=r["user"],
                    account=r["account"],
                    node=r["node"],
                    reason=r["reason"],
                    details=json.loads(r["details"] or "{}"),
                    outcome=r["outcome"],
                )
                for r in conn.execute(query.order_by(c.time, c.id)).mappings()
            ]

    def latest_decisions(
        self, targets: Sequence[str], dry_run: bool
    ) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
        """{(target, policy): (action, details)} of the newest audit entry of each pair."""
        c = audit_log.c
        latest: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        unique = sorted(set(targets))
        with self.store.reading("reading the latest decisions") as conn:
            for start in range(0, len(unique), 500):  # keep IN (...) lists short
                query = (
                    sa.select(c.target, c.policy, c.action, c.details)
                    .where(c.cluster == self.cluster, c.dry_run == dry_run)
                    .where(c.target.in_(unique[start : start + 500]))
                    .order_by(c.id)
                )
                for r in conn.execute(query):
                    latest[(r.target, r.policy)] = (r.action, json.loads(r.details or "{}"))
        return latest

    def newest_entries(
        self,
        targets: Sequence[str],
        policy: str,
        actions: Sequence[str],
        outcomes: Sequence[str],
    ) -> dict[str, AuditEntry]:
        """{target: its newest audit row of `policy` with one of `actions` and `outcomes`}.

        The hot_node policy reads its own drains ("drain", "done") and the admins'
        resumes it recorded ("none", "recorded") this way (issue 25 item 4).
        """
        c = audit_log.c
        wanted = set(targets)
        if not wanted:
            return {}
        query = (
            sa.select(audit_log)
            .where(c.cluster == self.cluster, c.policy == policy)
            .where(c.action.in_(list(actions)), c.outcome.in_(list(outcomes)))
            .order_by(c.time, c.id)
        )
        if len(wanted) <= 500:  # beyond, one read of the policy's rows: no long IN list
            query = query.where(c.target.in_(sorted(wanted)))
        newest: dict[str, AuditEntry] = {}
        with self.store.reading("reading the newest audit rows of targets") as conn:
            for r in conn.execute(query).mappings():
                if r["target"] in wanted:
                    newest[r["target"]] = _audit_entry(r)
        return newest

    def heartbeat_ticks(self, nodes: Sequence[str]) -> dict[str, float]:
        """{node: the tick of its agent's newest heartbeat in the store}, for `nodes`.

        A heartbeat is stored with the rows its tick queued before it (inventory and
        lost GPUs included: `slurm_gpu.store.heartbeats`), so what the store says of a
        node's GPUs is what its agent knew at that tick.
        """
        if not nodes:
            return {}
        with self.store.reading("reading node heartbeats") as conn:
            beats = read_heartbeats(conn, self.cluster, nodes)
        return {node: beat.tick for node, beat in beats.items()}

    # ---- exemptions -----------------------------------------------------------------

    def add_exemption(
        self,
        kind: str,
        target: str,
        until: float,
        reason: str,
        created_by: str,
        created_at: float,
        policy: str = "",
        user: str = "",
        account: str = "",
    ) -> int:
        """Records an exemption, and its audit row in the same transaction; returns its id.

        Args:
            kind: "job", "user" or "account".
            target: the job id, user or account name.
            until: when it stops applying (POSIX seconds).
            reason: why, as the admin gave it.
            created_by: who granted it (the caller's login).
            created_at: when (POSIX seconds).
            policy: the policy it exempts from; "" is every policy.
            user: the job's user, for a job exemption (so its owner sees the audit row).
            account: the job's account, likewise.
        """
        if kind not in ("job", "user", "account"):
            raise ValueError(f"exemption kind must be job, user or account, not {kind!r}")
        with self.store.writing("adding an exemption") as conn:
            result = conn.execute(
                exemptions.insert().values(
                    cluster=self.cluster,
                    kind=kind,
                    target=target,
                    policy=policy,
                    until=until,
                    reason=reason,
                    created_by=created_by,
                    created_at=created_at,
                )
            )
            exemption_id = _new_id(result)
            record = ExemptionRecord(
                exemption_id, kind, target, policy, until, reason, created_by, created_at
            )
            conn.execute(
                audit_log.insert().values(
                    cluster=self.cluster,
                    time=created_at,
                    cycle="",
                    controller=f"slurm-gpu exempt ({created_by})"[:255],
                    dry_run=False,
                    policy=policy or EVERY_POLICY,
                    action=Action.EXEMPT.value,
                    target=record.scope,
                    job_id=int(target) if kind == "job" else None,
                    user=user or (target if kind == "user" else ""),
                    account=account or (target if kind == "account" else ""),
                    node="",
                    reason=f"{record.describe()} granted: {reason}",
                    details=json.dumps(record.details(), sort_keys=True),
                    outcome="recorded",
                )
            )
            return exemption_id

    def exemptions(
        self, now: float | None = None, *, ended_since: float | None = None
    ) -> list[ExemptionRecord]:
        """Exemptions still in force at `now` (every one when None).

        With `ended_since`, instead those that ended in [ended_since, now] (expired).
        """
        c = exemptions.c
        query = sa.select(exemptions).where(c.cluster == self.cluster)
        if now is not None and ended_since is not None:
            query = query.where(c.until >= ended_since, c.until <= now)
        elif now is not None:
            query = query.where(c.until > now)
        with self.store.reading("reading exemptions") as conn:
            return [
                ExemptionRecord(
                    r["id"],
                    r["kind"],
                    r["target"],
                    r["policy"],
                    r["until"],
                    r["reason"],
                    r["created_by"],
                    r["created_at"],
                )
                for r in conn.execute(query.order_by(c.id)).mappings()
            ]

    # ---- lease ----------------------------------------------------------------------

    def acquire_lease(self, name: str, holder: str, now: float, ttl: float) -> bool:
        """Takes or renews the lease `name` for `holder` until now+ttl.

        The row is read under a lock (SELECT ... FOR UPDATE; SQLite's write transaction
        is already exclusive), so two controllers never both win. A lease that was free
        when read but taken by a racing insert surfaces as a key conflict: lost.
        """
        c = controller_lease.c
        try:
            with self.store.writing("taking the controller lease") as conn:
                current = conn.execute(
                    sa.select(c.holder, c.expires_at).where(c.name == name).with_for_update()
                ).first()
                if current is None:
                    conn.execute(
                        controller_lease.insert().values(
                            name=name, holder=holder, expires_at=now + ttl
                        )
                    )
                    return True
                if current.holder != holder and current.expires_at >= now:
                    return False
                conn.execute(
                    controller_lease.update()
                    .where(c.name == name)
                    .values(holder=holder, expires_at=now + ttl)
                )
                return True
        except StoreError as exc:
            if "unique" in str(exc).lower() or "duplicate" in str(exc).lower():
                return False
            raise

    def release_lease(self, name: str, holder: str) -> None:
        """Gives the lease up (a clean shutdown), so another controller need not wait."""
        c = controller_lease.c
        with self.store.writing("releasing the controller lease") as conn:
            conn.execute(controller_lease.delete().where(c.name == name, c.holder == holder))

    # ---- notifications ----------------------------------------------------------------

    def claim_notification(self, key: str, user: str, time: float, channels: str) -> bool:
        """Records that notification `key` goes out now; False if it already went.

        (Drivers disagree on the row count of an insert-or-ignore, so it is a read
        then an insert, in one transaction.)
        """
        c = notifications.c
        with self.store.writing("recording a notification") as conn:
            seen = conn.execute(
                sa.select(c.key).where(c.cluster == self.cluster, c.key == key)
            ).first()
            if seen is not None:
                return False
            conn.execute(
                notifications.insert().values(
                    cluster=self.cluster, key=key, user=user, time=time, channels=channels
                )
            )
            return True

    def release_notification(self, key: str) -> None:
        """Forgets claim `key` (its message did not go out), so a later cycle sends it."""
        c = notifications.c
        with self.store.writing("releasing a notification") as conn:
            conn.execute(notifications.delete().where(c.cluster == self.cluster, c.key == key))

    def last_notified(self, user: str) -> float | None:
        """When `user` was last sent anything (per-user rate limiting)."""
        c = notifications.c
        query = sa.select(sa.func.max(c.time)).where(c.cluster == self.cluster, c.user == user)
        with self.store.reading("reading notification times") as conn:
            value = conn.execute(query).scalar()
        return None if value is None else float(value)

    # ---- usage for quotas -----------------------------------------------------------

    # ---- history ----------------------------------------------------------------------

    def jobs_between(self, since: float, until: float) -> list[HistoricJob]:
        """GPU jobs that ran at some time in [since, until), with their GPUs per job_gpus."""
        j, g = jobs.c, job_gpus.c
        query = (
            sa.select(
                j.job_id,
                j.user,
                j.account,
                j.partition,
                j.job_name,
                j.start_time,
                j.end_time,
                sa.func.count(g.slurm_index).label("gpus"),
                sa.func.min(g.node).label("first_node"),
                sa.func.max(g.node).label("last_node"),
            )
            .select_from(jobs.join(job_gpus, (g.cluster == j.cluster) & (g.job_id == j.job_id)))
            .where(j.cluster == self.cluster, j.start_time.is_not(None), j.start_time < until)
            .where(sa.or_(j.end_time.is_(None), j.end_time > since))
            .group_by(
                j.job_id, j.user, j.account, j.partition, j.job_name, j.start_time, j.end_time
            )
            .order_by(j.start_time, j.job_id)
        )
        with self.store.reading("reading job history") as conn:
            return [
                HistoricJob(
                    int(r.job_id),
                    r.user or "",
                    r.account or "",
                    r.partition or "",
                    r.job_name or "",
                    float(r.start_time),
                    None if r.end_time is None else float(r.end_time),
                    int(r.gpus),
                    tuple(dict.fromkeys((r.first_node, r.last_node))),
                )
                for r in conn.execute(query)
            ]

    # ---- quota actions ----------------------------------------------------------------

    def quota_actions(self) -> list[QuotaAction]:
        """Everything the quota policy set and has not undone."""
        query = sa.select(quota_actions).where(quota_actions.c.cluster == self.cluster)
        with self.store.reading("reading quota actions") as conn:
            return [
                QuotaAction(
                    r["scope"],
                    r["action"],
                    r["target"],
                    r["applied_at"],
                    json.loads(r["details"] or "{}"),
                )
                for r in conn.execute(query).mappings()
            ]

    def record_quota_action(self, action: QuotaAction) -> None:
        """Remembers a quota action so it can be undone later."""
        with self.store.writing("recording a quota action") as conn:
            conn.execute(
                insert_ignore(self.store.dialect, quota_actions).values(
                    cluster=self.cluster,
                    scope=action.scope,
                    action=action.action,
                    target=action.target,
                    applied_at=action.applied_at,
                    details=json.dumps(action.details, sort_keys=True),
                )
            )

    def forget_quota_action(self, scope: str, action: str, target: str) -> None:
        """The action was undone."""
        c = quota_actions.c
        with self.store.writing("forgetting an undone quota action") as conn:
            conn.execute(
                quota_actions.delete().where(
                    c.cluster == self.cluster,
                    c.scope == scope,
                    c.action == action,
                    c.target == target,
                )
            )


def _audit_entry(r: Any) -> AuditEntry:
    """An audit_log row (a mapping) as an AuditEntry."""
    return AuditEntry(
        id=r["id"],
        time=r["time"],
        cycle=r["cycle"],
        controller=r["controller"],
        dry_run=bool(r["dry_run"]),
        policy=r["policy"],
        action=r["action"],
        target=r["target"],
        job_id=r["job_id"],
        user=r["user"],
        account=r["account"],
        node=r["node"],
        reason=r["reason"],
        details=json.loads(r["details"] or "{}"),
        outcome=r["outcome"],
    )


def _new_id(result: sa.CursorResult[Any]) -> int:
    """The autoincrement id of the row an INSERT just wrote."""
    key = result.inserted_primary_key
    assert key is not None, "INSERT without a primary key"
    return int(key[0])
