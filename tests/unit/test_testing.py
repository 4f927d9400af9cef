"""The public test doubles of slurm_gpu.testing behave as the real things they stand for."""

from __future__ import annotations

import pytest

from slurm_gpu.errors import SlurmError
from slurm_gpu.gpu import GpuSource
from slurm_gpu.models import GpuDevice, GpuProcess, SlurmJob
from slurm_gpu.slurm.client import CliSlurmClient, SlurmClient
from slurm_gpu.slurm.squeue import JobOwner
from slurm_gpu.testing import (
    CommandFailure,
    FakeGpuSource,
    FakeRunner,
    FakeSlurmClient,
    FixedClock,
    SlurmCall,
    UnexpectedCommand,
)

T0 = 1_800_000_000.0
GPU = GpuDevice("GPU-a", "Fake A100", 0, 0, "00:01", 80 * 2**30)


def job(job_id: int, state: str = "RUNNING", user: str = "alice") -> SlurmJob:
    """A job of `user` in account physics, partition gpu."""
    return SlurmJob(job_id, user, "physics", "gpu", state)


# --- FixedClock


def test_fixed_clock_reads_now_until_advanced() -> None:
    """The clock stands still; advance moves it and returns the new time."""
    clock = FixedClock(T0)
    assert (T0, T0, T0 + 5) == (clock(), clock(), clock.advance(5))
    assert T0 + 5 == clock()


# --- FakeRunner


def test_runner_refuses_an_unknown_argv_with_a_clear_message() -> None:
    """A command with no response fails the test, naming the argv and what is known."""
    runner = FakeRunner({("squeue",): ""})
    with pytest.raises(UnexpectedCommand) as caught:
        runner(["scancel", "7"])
    expected = "FakeRunner has no response for ['scancel', '7'] (responses for: squeue)"
    assert expected == str(caught.value)


def test_unknown_argv_is_not_a_slurm_error() -> None:
    """Code that survives Slurm failures cannot swallow a missing response."""
    assert not issubclass(UnexpectedCommand, SlurmError)


def test_runner_first_matching_prefix_answers() -> None:
    """Keys are tried in order: a specific one first, then a general one, then `()`."""
    runner = FakeRunner({("scontrol", "ping"): "specific", ("scontrol",): "general", (): ""})
    answers = [runner(["scontrol", "ping"]), runner(["scontrol", "show"]), runner(["scancel"])]
    assert ["specific", "general", ""] == answers


def test_runner_override_first_beats_a_specific_default() -> None:
    """`{**overrides, **defaults}`: an override of every squeue wins over squeue --json."""
    runner = FakeRunner({("squeue",): CommandFailure(1), ("squeue", "--json"): "{}"})
    with pytest.raises(SlurmError, match="squeue --json failed"):
        runner(["squeue", "--json"])


def test_runner_records_every_call_in_order() -> None:
    """calls holds each argv, an unexpected one included."""
    runner = FakeRunner({("squeue",): ""})
    runner(["squeue", "--json"])
    with pytest.raises(UnexpectedCommand):
        runner(["sinfo"])
    assert [["squeue", "--json"], ["sinfo"]] == runner.calls


def test_runner_failure_reads_like_slurm_commands() -> None:
    """A CommandFailure raises the SlurmError SlurmCommands gives for that exit."""
    runner = FakeRunner({("scancel",): CommandFailure(1, stderr="x\nscancel: Invalid job id\n")})
    with pytest.raises(SlurmError) as caught:
        runner(["scancel", "99"])
    assert "scancel 99 failed (exit 1): scancel: Invalid job id" == str(caught.value)


def test_runner_callable_response_sees_the_argv() -> None:
    """A function response is called with the whole argv."""
    runner = FakeRunner({("echo",): lambda argv: " ".join(argv[1:])})
    assert "a b" == runner(["echo", "a", "b"])


def test_runner_outage_fails_every_command() -> None:
    """While outage is set, every command raises it, even one with a response."""
    runner = FakeRunner({("squeue",): ""})
    runner.outage = SlurmError("slurmctld is not responding")
    with pytest.raises(SlurmError, match="not responding"):
        runner(["squeue"])


def test_runner_drives_the_cli_client() -> None:
    """FakeRunner is a CommandRunner: CliSlurmClient runs its commands through it."""
    runner = FakeRunner({("scontrol", "ping"): "Slurmctld(primary) at head is UP\n"})
    CliSlurmClient(runner).ping()
    assert ["scontrol ping"] == runner.commands()


# --- FakeSlurmClient


def test_slurm_client_is_a_slurm_client() -> None:
    """FakeSlurmClient satisfies the SlurmClient protocol."""
    assert isinstance(FakeSlurmClient(), SlurmClient)


def test_slurm_client_records_cancels() -> None:
    """A cancel is recorded with its reason; the job stays in the queue."""
    slurm = FakeSlurmClient([job(7)])
    assert {7: None} == slurm.cancel([7], "idle GPU")
    assert ([(7, "idle GPU")], [7]) == (slurm.cancelled, [j.job_id for j in slurm.jobs()])


def test_slurm_client_per_job_results_as_the_cli_client() -> None:
    """An unknown job is not found; a refused one fails with its text; the rest succeed."""
    slurm = FakeSlurmClient([job(1), job(2, "PENDING")])
    slurm.refusals[2] = "scontrol hold: Job is not pending"
    expected = {
        1: None,
        2: "scontrol hold: Job is not pending",
        3: "job 3 not found by squeue (finished or unknown)",
    }
    assert expected == slurm.hold([1, 2, 3], "over quota")


def test_slurm_client_lists_jobs_by_state() -> None:
    """jobs(states) keeps the queue's jobs in those states; no states means all."""
    slurm = FakeSlurmClient([job(1), job(2, "PENDING"), job(3, "COMPLETING")])
    listed = ([j.job_id for j in slurm.jobs(["pending"])], [j.job_id for j in slurm.jobs(())])
    assert ([2], [1, 2, 3]) == listed


def test_slurm_client_running_owners_come_from_the_queue() -> None:
    """Running and completing jobs have owners; pending ones do not."""
    slurm = FakeSlurmClient([job(1), job(2, "PENDING"), job(3, "COMPLETING", "bob")])
    expected = {1: JobOwner("alice", "physics"), 3: JobOwner("bob", "physics")}
    assert expected == slurm.running_owners()


def test_slurm_client_update_of_unknown_job_raises() -> None:
    """set_time_limit of a job squeue does not list raises SlurmError, and is recorded."""
    slurm = FakeSlurmClient()
    with pytest.raises(SlurmError, match="job 9 not found"):
        slurm.set_time_limit(9, 3600.0)
    assert [SlurmCall("set_time_limit", (9, 3600.0))] == slurm.calls


def test_slurm_client_outage_fails_every_method() -> None:
    """While outage is set, every method raises it after recording the call."""
    slurm = FakeSlurmClient()
    slurm.outage = SlurmError("Unable to contact slurm controller")
    with pytest.raises(SlurmError, match="Unable to contact"):
        slurm.ping()
    assert ["ping"] == [call.method for call in slurm.calls]


def test_slurm_client_set_association_records_its_fields() -> None:
    """Keyword fields arrive as one dict, after the account and user."""
    slurm = FakeSlurmClient()
    slurm.set_association("physics", "alice", GrpTRES="gres/gpu=0")
    assert [("physics", "alice", {"GrpTRES": "gres/gpu=0"})] == slurm.calls_to("set_association")


# --- FakeGpuSource


def test_gpu_source_is_a_gpu_source() -> None:
    """FakeGpuSource has every method of the GpuSource protocol."""
    source: GpuSource = FakeGpuSource([GPU], FixedClock(T0))
    assert [GPU] == source.devices()


def test_gpu_source_samples_once_a_second_since_the_last_read() -> None:
    """A snapshot holds one sample per whole second after samples_since, up to now."""
    clock = FixedClock(T0 + 3)
    source = FakeGpuSource([GPU], clock, util={"GPU-a": lambda t: t - T0})
    samples = source.snapshot(GPU, T0).samples
    assert [(T0 + 1, 1.0), (T0 + 2, 2.0), (T0 + 3, 3.0)] == [
        (s.time, s.util_percent) for s in samples
    ]


def test_lost_gpu_reads_as_an_error() -> None:
    """A lost GPU answers with its error and no readings."""
    source = FakeGpuSource([GPU], FixedClock(T0))
    source.lost.add("GPU-a")
    snapshot = source.snapshot(GPU, T0 - 10)
    assert ("GPU is lost", (), None) == (snapshot.error, snapshot.samples, snapshot.power_watts)


def test_unsupported_fields_are_none_the_others_read() -> None:
    """A field NVML does not support is None; the other fields are still read."""
    source = FakeGpuSource([GPU], FixedClock(T0))
    source.unsupported.add("power_watts")
    source.processes["GPU-a"] = (GpuProcess(42, 2**30),)
    snapshot = source.snapshot(GPU, T0)
    assert (None, (GpuProcess(42, 2**30),)) == (snapshot.power_watts, snapshot.processes)


def test_gpu_source_records_reads_and_close() -> None:
    """reads holds (uuid, samples_since) per snapshot; close marks the source closed."""
    source = FakeGpuSource([GPU], FixedClock(T0))
    source.snapshot(GPU, T0 - 1)
    source.close()
    assert ([("GPU-a", T0 - 1)], True) == (source.reads, source.closed)


def test_gpu_source_gpm_is_the_mean_since_the_previous_read() -> None:
    """A GPU named in gpm: no window at the first read, then the mean over the seconds since."""
    clock = FixedClock(T0)
    source = FakeGpuSource(
        [GPU], clock, gpm={"GPU-a": lambda t: {"sm_active_percent": 10.0 if t <= T0 + 2 else 40.0}}
    )
    first = source.snapshot(GPU, T0).gpm
    clock.advance(4)
    second = source.snapshot(GPU, T0).gpm
    assert first is None
    assert second is not None
    assert (T0, T0 + 4, 25.0, None) == (
        second.start,
        second.end,
        second.sm_active_percent,
        second.tensor_active_percent,
    )


def test_gpu_source_devices_say_which_gpus_have_gpm() -> None:
    """devices() marks the GPUs named in gpm as gpm_supported; the others have no GPM."""
    other = GpuDevice("GPU-b", "Fake A100", 1, 1, "00:02", 80 * 2**30)
    source = FakeGpuSource([GPU, other], FixedClock(T0), gpm={"GPU-a": lambda t: {}})
    source.snapshot(other, T0)
    assert ([True, False], None) == (
        [d.gpm_supported for d in source.devices()],
        source.snapshot(other, T0 + 10).gpm,
    )


def test_gpu_source_unsupported_gpm_metric_is_none() -> None:
    """A GpmMetrics field in `unsupported` reads None; the GPU's other metrics stand."""
    clock = FixedClock(T0)
    levels = {"sm_active_percent": 30.0, "dram_bw_percent": 20.0}
    source = FakeGpuSource([GPU], clock, gpm={"GPU-a": lambda t: levels})
    source.unsupported.add("dram_bw_percent")
    source.snapshot(GPU, T0)
    clock.advance(10)
    gpm = source.snapshot(GPU, T0).gpm
    assert gpm is not None
    assert (30.0, None) == (gpm.sm_active_percent, gpm.dram_bw_percent)
