"""The controller's local audit spool (#11 item 14): rows, their outcomes, a torn last line."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_gpu.models import Action, Verdict
from slurm_gpu.policy.audit_spool import AuditSpool
from slurm_gpu.store.control import audit_row

CANCEL = Verdict("max_runtime", Action.CANCEL, "job:1", "limit", job_id=1, user="bob")


def row(outcome: str = "planned") -> dict[str, object]:
    return audit_row(CANCEL, time=1.0, cycle="c", controller="h", dry_run=False, outcome=outcome)


def test_a_spooled_row_reads_back_with_its_latest_outcome_and_details(tmp_path: Path) -> None:
    """add, then update: one row, outcome "done", the added figure merged into its details."""
    spool = AuditSpool(tmp_path / "dir" / "spool.jsonl")
    (spool_id,) = spool.add([row()])
    spool.update(spool_id, outcome="done", notified="email")
    (got,) = spool.rows()
    assert ("cancel", "done") == (got["action"], got["outcome"])
    assert {"notified": "email"} == json.loads(str(got["details"]))


def test_a_line_torn_by_a_crash_is_skipped_and_clear_empties_the_spool(tmp_path: Path) -> None:
    """A half-written last line is not a row (it was never acted on); clear() leaves none."""
    spool = AuditSpool(tmp_path / "spool.jsonl")
    spool.add([row(), row()])
    with spool.path.open("a") as torn:
        torn.write('{"id": "x", "row": {"act')
    assert 2 == len(spool.rows())
    spool.clear()
    assert [] == spool.rows()
