"""The GPM figures as users see them: sacct, report, the job view, the monthly report, cost.

A store of November 2026 with H100 jobs that GPM measured (SM activity, occupancy,
tensor, DRAM bandwidth) and A100 jobs it could not: the A100s' figures must read blank,
never 0 %, and `[cost] charge = "effective"` must bill them as held.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from slurm_gpu.cli.main import cli
from slurm_gpu.config.reports import CostSettings
from slurm_gpu.models import GpuDevice, GpuInterval, JobGpuSummary
from slurm_gpu.reports.pricing import add_cost
from slurm_gpu.reports.widgets import esc
from slurm_gpu.store import Store
from tests.usage_sources import as_source

NOV = dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp()
H = 3600.0
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
PERIOD = ["-S", "2026-11-01T00:00", "-E", "2026-12-01T00:00"]


def summary(job: int, node: str, gpu: str, model: str, hours: float, util: float,
            gpm: tuple[float, float, float, float] | None = None,
            gpm_hours: float | None = None) -> JobGpuSummary:  # fmt: skip
    """One GPU of a job from NOV + job hours; `gpm` = (SM, occupancy, tensor, DRAM) %."""
    seconds = hours * H
    start = NOV + job * H
    sm, occ, tensor, dram = gpm if gpm is not None else (None, None, None, None)
    return JobGpuSummary(
        job_id=job, node=node, gpu_uuid=gpu, gpu_model=model, start=start,
        end=start + seconds, gpu_seconds=seconds, util_mean_percent=util,
        util_max_percent=util, active_seconds=seconds, mem_max_bytes=2**30,
        mem_gib_seconds=seconds, energy_joules=1000.0, reading_count=10,
        missing_seconds=0.0,
        gpm_seconds=0.0 if gpm is None else (gpm_hours if gpm_hours is not None else hours) * H,
        sm_active_mean_percent=sm, sm_occupancy_mean_percent=occ,
        tensor_active_mean_percent=tensor, dram_bw_mean_percent=dram,
    )  # fmt: skip


Gpu = tuple[str, str, str, float, float, tuple[float, float, float, float] | None]
JOBS: list[tuple[int, str, str, list[Gpu]]] = [
    # job, user, account, GPUs: (node, uuid, model, hours, util, GPM figures)
    (1, "alice", "physics", [("gpu2", "GPU-h1", H100, 2.0, 97.0, (3.0, 2.0, 0.0, 1.0))]),
    (2, "bob", "chem", [("gpu1", "GPU-a1", A100, 1.0, 90.0, None)]),
    (3, "carol", "physics", [("gpu2", "GPU-h2", H100, 1.0, 90.0, (30.0, 20.0, 60.0, 10.0))]),
    (4, "dave", "bio", [("gpu2", "GPU-h3", H100, 1.0, 95.0, (40.0, 30.0, 5.0, 80.0))]),
    (5, "erin", "bio", [("gpu2", "GPU-h4", H100, 1.0, 85.0, (60.0, 40.0, 0.0, 20.0)),
                        ("gpu1", "GPU-a2", A100, 1.0, 85.0, None)]),
]  # fmt: skip


def devices(model: str, uuids: list[str], gpm: bool) -> list[GpuDevice]:
    return [
        GpuDevice(uuid=u, name=model, minor=i, nvml_index=i, pci_bus_id=f"0000:{i:02x}:00.0",
                  memory_total_bytes=80 * 2**30, gpm_supported=gpm)
        for i, u in enumerate(uuids)
    ]  # fmt: skip


@pytest.fixture
def store(store: Store, usage_source: str) -> Store:
    """Five finished jobs in November; the agents' inventory says which GPUs have GPM."""
    store.upsert_jobs(
        [
            {"job_id": j, "user": u, "account": a, "partition": "gpu", "job_name": f"job{j}",
             "state": "COMPLETED", "submit_time": NOV + j * H - 60, "start_time": NOV + j * H,
             "end_time": NOV + j * H + max(g[3] for g in gpus) * H,
             "nodes": ",".join(sorted({g[0] for g in gpus})), "gpus": len(gpus)}
            for j, u, a, gpus in JOBS
        ]
    )  # fmt: skip
    store.add_summaries([summary(j, *g) for j, _, _, gpus in JOBS for g in gpus])
    store.upsert_inventory("gpu1", devices(A100, ["GPU-a1", "GPU-a2"], False), seen_at=NOV)
    store.upsert_inventory(
        "gpu2", devices(H100, ["GPU-h1", "GPU-h2", "GPU-h3", "GPU-h4"], True), seen_at=NOV
    )
    return as_source(store, usage_source)


def run(store: Store, tmp_path: Path, *args: str, cost: str = "") -> str:
    """`slurm-gpu ARGS` as root over the store; its stdout."""
    config = tmp_path / "c.toml"
    config.write_text(
        f'[cluster]\nname = "c"\n[store]\nurl = "{store.engine.url}"\n'
        "[reports]\nlive_sacct = false\n[access]\nslurm_roles = false\n"
        f"[cost]\nprices = {{ a100 = 2.0, h100 = 4.0 }}\n{cost}"
    )
    done = CliRunner().invoke(cli, ["--config", str(config), *args])
    assert 0 == done.exit_code, done.output
    return done.output


def sacct_rows(store: Store, tmp_path: Path, fields: str, cost: str = "") -> dict[str, list[str]]:
    out = run(store, tmp_path, "sacct", "-a", *PERIOD, "-P", "-o", fields, cost=cost)
    return {line.split("|")[0]: line.split("|")[1:] for line in out.splitlines()[1:]}


def test_sacct_gpm_fields_are_blank_where_not_measured(store: Store, tmp_path: Path) -> None:
    """H100 jobs show their GPM means; the A100 job's are blank, not 0."""
    fields = "JobID,SMActiveAvg,SMOccupancyAvg,TensorActiveAvg,DRAMBWAvg,EffectiveGPUHours"
    rows = sacct_rows(store, tmp_path, fields)
    assert ["30.0", "20.0", "60.0", "10.0", "0.3000"] == rows["3"]
    assert ["", "", "", "", ""] == rows["2"]
    assert ["3.0", "2.0", "0.0", "1.0", "0.0600"] == rows["1"]  # 2 h x 3 %


def test_sacct_partly_measured_job_weights_the_measured_gpu_only(
    store: Store, tmp_path: Path
) -> None:
    """Job 5: an H100 at 60 % SM and an A100 unmeasured: 60 % over 1 of 2 GPU-hours."""
    rows = sacct_rows(store, tmp_path, "JobID,GPUHours,SMActiveAvg,EffectiveGPUHours,GPMGPUHours")
    assert ["2.0000", "60.0", "0.6000", "1.0000"] == rows["5"]


def test_sacct_gpus_rows_and_helpformat(store: Store, tmp_path: Path) -> None:
    """--gpus: one row per GPU, the A100's blank; --helpformat lists the GPM fields."""
    out = run(store, tmp_path, "sacct", "-a", *PERIOD, "--gpus", "-P", "-o",
              "JobID,GPU,SMActiveAvg,TensorActiveAvg")  # fmt: skip
    assert {"5|GPU-h4|60.0|0.0", "5|GPU-a2||"} <= set(out.splitlines())
    helped = run(store, tmp_path, "sacct", "--helpformat")
    for name in ("SMActiveAvg", "SMOccupancyAvg", "TensorActiveAvg", "DRAMBWAvg",
                 "EffectiveGPUHours", "GPMGPUHours", "IdleHeldCost"):  # fmt: skip
        assert any(line.startswith(name + " ") for line in helped.splitlines()), name


def test_report_accounts_show_gpm_columns_blank_for_an_a100_account(
    store: Store, tmp_path: Path
) -> None:
    """report accounts: chem (A100 only) blank GPM means and 0 % measured; physics weighted."""
    fields = "Account,GPUHours,SMActiveAvg,TensorActiveAvg,DRAMBWAvg,EffectiveGPUHours,GPMPct"
    out = run(store, tmp_path, "report", "accounts", *PERIOD, "-P", "-o", fields)
    rows = {line.split("|")[0]: line.split("|")[1:] for line in out.splitlines()[1:]}
    assert ["1.0000", "", "", "", "", "0.0"] == rows["chem"]
    # physics: 2 h at 3 % and 1 h at 30 %: SM (6 + 30) / 3 = 12 %, tensor 60 / 3 = 20 %.
    assert ["3.0000", "12.0", "20.0", "4.0", "0.3600", "100.0"] == rows["physics"]
    assert "1.0000" == rows["chem"][0]


def test_report_json_has_null_where_not_measured(store: Store, tmp_path: Path) -> None:
    """--json: the A100 account's SM activity is null, the cluster's a number."""
    out = run(store, tmp_path, "report", "accounts", *PERIOD, "--json")
    document = json.loads(out)
    rows = {r["Account"]: r for r in document["rows"]}
    assert rows["chem"]["SMActiveAvg"] is None
    assert rows["chem"]["EffectiveGPUHours"] is None
    assert 12.0 == rows["physics"]["SMActiveAvg"]
    assert "held" == document["charge"]
    assert "IdleHeldCost" not in document["total"]  # "held": nothing is priced apart


def test_job_view_gpm_table_and_not_measured_note(store: Store, tmp_path: Path) -> None:
    """The A100's row says not measured and why; no 0 % for it; the H100's figures shown."""
    text = run(store, tmp_path, "job", "5")
    assert (
        "SM activity is not measured on this GPU (model NVIDIA A100-SXM4-80GB has no GPM)" in text
    )
    table = [line.split() for line in text.splitlines() if line.startswith("  gpu")]
    assert ["gpu1", "GPU-a2", "not", "measured", "(this", "model", "has", "no", "GPM)"] in table
    assert ["gpu2", "GPU-h4", "60.0%", "40.0%", "0.0%", "20.0%", "100%"] in table
    assert "partial" in text  # one of two GPUs measured


def test_job_view_a100_only_job_never_says_zero(store: Store, tmp_path: Path) -> None:
    """An A100-only job: SM activity not measured, in the totals and the notes; no 0.0% SM."""
    text = run(store, tmp_path, "job", "2")
    assert "SM activity not measured (no GPU of this job has GPM readings)" in text
    assert "SM activity is not measured on this GPU" in text
    assert "SM active 0" not in text
    document = json.loads(run(store, tmp_path, "job", "2", "--json"))
    (gpu,) = document["gpus"]
    assert (None, 0.0, False) == (
        gpu["sm_active_mean_percent"],
        gpu["gpm_seconds"],
        gpu["gpm_supported"],
    )


def test_job_view_notes_fake_busy_memory_bound_and_no_tensor(store: Store, tmp_path: Path) -> None:
    """97 % duty cycle at 3 % SM; DRAM 80 % at SM 40 %; busy H100 with no tensor use."""
    fake = run(store, tmp_path, "job", "1")
    assert "Duty cycle 97% but only 3% of SMs active on gpu2/GPU-h1" in fake
    assert "No tensor-core use" not in fake  # the fake-busy note says more
    bound = run(store, tmp_path, "job", "4")
    assert "Memory-bandwidth bound on gpu2/GPU-h3: DRAM bandwidth 80% of its peak" in bound
    no_tensor = run(store, tmp_path, "job", "5")
    assert "No tensor-core use on gpu2/GPU-h4 (NVIDIA H100 80GB HBM3)" in no_tensor
    fine = run(store, tmp_path, "job", "3")
    assert "SM active 30.0%  occupancy 20.0%  tensor 60.0%  DRAM BW 10.0%" in fine
    assert not any(w in fine for w in ("Duty cycle", "No tensor", "Memory-bandwidth"))


def test_effective_charge_bills_sm_activity_and_prices_idle_held_apart(
    store: Store, tmp_path: Path
) -> None:
    """Job 3 (1 H100-hour at 30 % SM, 4/h): Cost 1.20, IdleHeldCost 2.80.

    Job 2 (A100, no GPM): billed as held, 2.00, nothing idle held; job 5 half of each.
    """
    effective = 'charge = "effective"\n'
    rows = sacct_rows(store, tmp_path, "JobID,Cost,IdleHeldCost", cost=effective)
    assert ["1.20", "2.80"] == rows["3"]
    assert ["2.00", "0.00"] == rows["2"]
    assert ["4.40", "1.60"] == rows["5"]  # H100 4 x 0.6 + A100 2.00; 4 x 0.4 held
    held = sacct_rows(store, tmp_path, "JobID,Cost,IdleHeldCost")
    assert ["4.00", ""] == held["3"]  # default: every hour held is charged
    view = run(store, tmp_path, "job", "3", cost=effective)
    assert "cost 1.20 EUR (+ idle held 2.80 EUR, priced apart)" in view


def test_effective_charge_in_sacct_default_and_report_header(store: Store, tmp_path: Path) -> None:
    """Charge "effective": sacct's default columns end with IdleHeldCost; report says the rule."""
    effective = 'charge = "effective"\n'
    out = run(store, tmp_path, "sacct", "-a", *PERIOD, cost=effective)
    assert out.splitlines()[0].split()[-2:] == ["Cost", "IdleHeldCost"]
    report = run(store, tmp_path, "report", "accounts", *PERIOD, cost=effective)
    assert 'Charge "effective": Cost is the GPU time GPM measured x its SM activity' in report
    csv_text = run(store, tmp_path, "report", "accounts", *PERIOD, "--csv", "-o",
                   "Account,Cost,IdleHeldCost,GPMPct", cost=effective)  # fmt: skip
    rows = {r["Account"]: r for r in csv.DictReader(csv_text.splitlines())}
    assert ("2.00", "0.00", "0.0") == (rows["chem"]["Cost"], rows["chem"]["IdleHeldCost"],
                                       rows["chem"]["GPMPct"])  # fmt: skip
    total = rows["TOTAL"]
    held = run(store, tmp_path, "report", "cluster", *PERIOD, "--csv", "-o", "Cost")
    # Nothing is free: Cost + IdleHeldCost is what "held" charges.
    assert float(held.splitlines()[1]) == pytest.approx(
        float(total["Cost"]) + float(total["IdleHeldCost"])
    )


def test_running_job_reads_gpm_from_its_intervals(store: Store, tmp_path: Path) -> None:
    """A running job's SM activity is its intervals', weighted by their GPM seconds."""
    start = NOV + 20 * H
    store.upsert_jobs(
        [{"job_id": 9, "user": "alice", "account": "physics", "partition": "gpu",
          "state": "RUNNING", "submit_time": start, "start_time": start, "nodes": "gpu2",
          "gpus": 1}]
    )  # fmt: skip
    store.add_intervals(
        [
            GpuInterval(
                node="gpu2", gpu_uuid="GPU-h1", period_start=start + i * 60,
                period_end=start + (i + 1) * 60, job_id=9, util_mean_percent=90.0,
                util_max_percent=90.0, util_min_percent=90.0, util_sample_count=6,
                active_seconds=60.0, covered_seconds=60.0, mem_used_max_bytes=2**30,
                mem_total_bytes=80 * 2**30, power_mean_watts=100.0, energy_joules=6000.0,
                temperature_max_celsius=50.0, ecc_errors_total=0, gpm_seconds=gpm,
                sm_active_mean_percent=sm, tensor_active_mean_percent=sm,
            )
            for i, (gpm, sm) in enumerate([(30.0, 10.0), (60.0, 40.0)])
        ]
    )  # fmt: skip
    rows = sacct_rows(store, tmp_path, "JobID,SMActiveAvg,GPMGPUHours,DataSource")
    assert ["30.0", "0.0250", "intervals"] == rows["9"]  # (30 x 10 + 60 x 40) / 90


def test_monthly_efficiency_section(store: Store, tmp_path: Path) -> None:
    """The page's section and its CSV: per account, A100-only chem blank, a partial note."""
    out = tmp_path / "out"
    run(store, tmp_path, "report", "monthly", "--month", "2026-11", "--out", str(out))
    page = (out / "index.html").read_text()
    section = page.split('<section id="efficiency">')[1].split("</section>")[0]
    assert "<h2>Efficiency beyond utilization</h2>" in section
    assert "GPM measured 71 % of the GPU-hours" in section  # 5 of 7 GPU-hours
    with (out / "efficiency_accounts.csv").open() as handle:
        rows = {r["name"]: r for r in csv.DictReader(handle)}
    assert ("", "", "0.0") == (rows["chem"]["sm_active_mean_percent"],
                               rows["chem"]["effective_gpu_hours"],
                               rows["chem"]["gpm_percent"])  # fmt: skip
    assert "12.0" == rows["physics"]["sm_active_mean_percent"]
    assert "0.36" == rows["physics"]["effective_gpu_hours"]
    with (out / "efficiency_users.csv").open() as handle:
        users = [r["name"] for r in csv.DictReader(handle)]
    # By GPM GPU-hours, then GPU-hours (erin's A100 hour), then name; bob unmeasured.
    assert ["alice", "erin", "carol", "dave"] == users


def test_monthly_of_a100s_only_says_nothing_was_measured(tmp_path: Path) -> None:
    """A cluster of A100s: the section says GPM measured nothing; no figure reads 0."""
    a100s = Store(f"sqlite:///{tmp_path / 'a.db'}", cluster="c")
    a100s.upgrade()
    a100s.upsert_jobs(
        [{"job_id": 2, "user": "bob", "account": "chem", "partition": "gpu",
          "state": "COMPLETED", "submit_time": NOV + H, "start_time": NOV + 2 * H,
          "end_time": NOV + 3 * H, "nodes": "gpu1", "gpus": 1}]
    )  # fmt: skip
    a100s.add_summaries([summary(2, "gpu1", "GPU-a1", A100, 1.0, 90.0)])
    out = tmp_path / "out"
    try:
        run(a100s, tmp_path, "report", "monthly", "--month", "2026-11", "--out", str(out))
    finally:
        a100s.dispose()
    section = (out / "index.html").read_text().split('<section id="efficiency">')[1]
    assert "No GPU-hour of this month was measured by NVML GPM" in section
    assert esc(f"(this month's GPUs: {A100})") in section
    with (out / "overview.csv").open() as handle:
        overview = {r["figure"]: r["value"] for r in csv.DictReader(handle)}
    figures = ("sm_active_mean_percent", "effective_gpu_hours", "gpm_gpu_hours")
    assert ("", "", "0.0") == tuple(overview[k] for k in figures)


def test_effective_charge_of_a_partly_measured_gpu() -> None:
    """Half an H100-hour measured at 50 % SM: a quarter of its charge is idle held.

    The unmeasured half is charged in full, and so is a GPU of unknown SM activity.
    """
    gpus = pd.DataFrame(
        {"job_id": [1, 1], "gpu_uuid": ["GPU-h", "GPU-x"], "gpu_model": [H100, H100],
         "gpu_seconds": [H, H], "mem_gib_seconds": [0.0, 0.0], "gpm_seconds": [H / 2, H],
         "sm_active_mean_percent": [50.0, float("nan")]}
    )  # fmt: skip
    jobs = pd.DataFrame({"job_id": [1], "elapsed_seconds": [H]})
    for unit, whole in (("gpu_hour", 4.0), ("job_hour", 2.0)):  # job_hour: shared by 2 GPUs
        cost = CostSettings(unit=unit, prices={"h100": 4.0}, charge="effective")  # type: ignore[arg-type]
        priced = add_cost(gpus, jobs, cost)
        assert [whole * 0.75, whole] == priced["cost"].tolist()
        assert [whole * 0.25, 0.0] == priced["idle_held_cost"].tolist()
