"""`slurm-gpu job <leader id>` of a heterogeneous job shows its components together.

`sacct -j <leader>` lists every component (`<leader>+<offset>`); so does `slurm-gpu job`,
instead of refusing with "name one" (issue #11).
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.hetjob import het_components
from slurm_gpu.cli.main import cli
from slurm_gpu.models import JobEvent, JobEventKind, JobGpuSummary
from slurm_gpu.store import Store

T0 = 1_800_000_000.0


def run(args: list[str], tmp_path: Path) -> Result:
    app = AppContext(env={}, default_path=tmp_path / "absent.toml")
    return CliRunner().invoke(cli, args, obj=app)


def het_store(tmp_path: Path) -> Path:
    """A store holding het job 100 (components 100+0 and 100+1, one GPU each), and job 7."""
    config = tmp_path / "slurm-gpu.toml"
    config.write_text(
        f'[cluster]\nname = "alpha"\n[store]\nurl = "sqlite:///{tmp_path}/s.db"\n'
        "[reports]\nlive_sacct = false\n"
    )
    with Store(f"sqlite:///{tmp_path}/s.db", cluster="alpha") as store:
        store.upgrade()
        for job, offset, index in ((100, 0, 0), (101, 1, 1), (7, None, 2)):
            het = {} if offset is None else {"het_job_id": 100, "het_job_offset": offset}
            common = {"node": "gpu1", "job_id": job, "user": "alice", **het}
            store.add_events(
                [
                    JobEvent(kind=JobEventKind.STARTED, time=T0, gpu_indices=(index,), **common),  # type: ignore[arg-type]
                    JobEvent(kind=JobEventKind.ENDED, time=T0 + 60, exit_code=0, **common),  # type: ignore[arg-type]
                ]
            )
            store.add_summaries(
                [
                    JobGpuSummary(
                        job_id=job,
                        node="gpu1",
                        gpu_uuid=f"GPU-{index}",
                        gpu_model="A100",
                        start=T0,
                        end=T0 + 60,
                        gpu_seconds=60.0,
                        util_mean_percent=50.0,
                        util_max_percent=60.0,
                        active_seconds=60.0,
                        mem_max_bytes=2**30,
                        mem_gib_seconds=60.0,
                        energy_joules=600.0,
                        reading_count=12,
                        missing_seconds=0.0,
                        user="alice",
                    )
                ]
            )
    return config


def test_leader_id_shows_every_component(tmp_path: Path) -> None:
    """`job 100` names the het job and shows 100+0 and 100+1, each with its GPU."""
    config = het_store(tmp_path)
    result = run(["--config", str(config), "job", "100"], tmp_path)
    assert 0 == result.exit_code, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("Heterogeneous job 100: 2 components (100+0, 100+1)")
    assert ["Job 100+0 (100)", "Job 100+1 (101)"] == [
        line[: len("Job 100+0 (100)")]
        for line in result.output.splitlines()
        if line.startswith("Job ")
    ]


def test_leader_id_as_json_lists_the_components(tmp_path: Path) -> None:
    """`job 100 --json` is one document with each component's own."""
    config = het_store(tmp_path)
    result = run(["--config", str(config), "job", "100", "--json"], tmp_path)
    document = json.loads(result.output)
    assert (100, [100, 101]) == (
        document["het_job_id"],
        [c["job"]["job_id"] for c in document["components"]],
    )


def test_component_id_shows_that_component_only(tmp_path: Path) -> None:
    """`job 101` (component 100+1's own id) is that component's view alone."""
    config = het_store(tmp_path)
    result = run(["--config", str(config), "job", "101"], tmp_path)
    assert (0, False) == (result.exit_code, "Heterogeneous" in result.output)
    assert "Job 100+1 (101)" in result.output


def test_records_of_two_het_jobs_are_not_components() -> None:
    """Records of different leaders, or without offsets, are no one het job."""
    a = {"job_id": 1, "job_id_text": "1+0"}
    b = {"job_id": 3, "job_id_text": "2+1"}
    c = {"job_id": 4, "job_id_text": "4"}
    assert (None, None) == (het_components([a, b]), het_components([a, c]))
