"""`slurm-gpu db rebuild-rollups` on every backend: the rollups ingest wrote, again.

The rebuild folds the jobs in order of start a chunk at a time and writes each day once
it is whole (store/usage_rollup.py `rebuild`); its SQL (the jobs ordered by start,
DISTINCT with the ORDER BY column selected, as PostgreSQL wants) runs on SQLite,
PostgreSQL and MariaDB, with chunks of 4 jobs so that days close while jobs are folded.
The longest job (revision 0012) and the jobs across each midnight (revision 0013) are
recomputed with them. An upgrade through a revision that changes the rollups (`REFOLDS`)
ends with this rebuild (migrations/env.py), in the upgrade's transaction.
"""

from __future__ import annotations

import pytest

from slurm_gpu.store import Store, rollup_reads, usage_rollup
from tests.synthetic_usage import approx_tables, fill, longest_folded, tables


def test_rebuilt_rollups_equal_those_of_ingest(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild 4 jobs at a time writes every rollup and the longest job as ingest did."""
    fill(store)
    ingested = tables(store)
    assert ingested["usage_daily"] and ingested["usage_monthly"] and ingested["usage_across"]
    monkeypatch.setattr(usage_rollup, "CHUNK", 4)
    assert len(ingested["job_usage"]) == store.rebuild_rollups()
    approx_tables(ingested, tables(store))
    assert rollup_reads.longest_job(store) == pytest.approx(longest_folded(store))
