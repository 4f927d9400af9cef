# The project writes `expected == actual` (DESIGN.md); ruff calls that a Yoda condition.
"""The Slurm prolog/epilog hooks, run for real with /bin/sh and a controlled environment.

Each test copies both scripts and the library they source into a temp dir next to a
`slurm-gpu-hooks.conf` that points STATE_DIR and LOG_FILE into that temp dir (the hooks
read the conf next to themselves first), then runs them the way slurmd does: as root,
env only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROLOG = ROOT / "hooks" / "slurm-gpu-prolog"
EPILOG = ROOT / "hooks" / "slurm-gpu-epilog"
LIBRARY = ROOT / "hooks" / "slurm-gpu-hooks.sh"
INSTALLED_LIBRARY = Path("/usr/libexec/slurm-gpu/slurm-gpu-hooks.sh")  # the hooks' fallback

JOB_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_ACCOUNT": "physics",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURM_JOB_GPUS": "0,1",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "SLURMD_NODENAME": "gpu1",
    "SLURM_CLUSTER_NAME": "testbed",
}


@dataclass
class Hooks:
    """Copies of the hooks in a temp dir, with their conf, state dir and log file."""

    dir: Path
    state: Path
    log: Path

    def conf(self, text: str) -> None:
        """Replace the hooks' conf file with `text`."""
        (self.dir / "slurm-gpu-hooks.conf").write_text(text)

    def run(self, hook: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """Run `hook` ("prolog" or "epilog") with exactly `env` (plus PATH)."""
        return subprocess.run(
            ["/bin/sh", str(self.dir / f"slurm-gpu-{hook}")],
            env={"PATH": "/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
            timeout=10,
        )

    def node(self, name: str = "gpu1") -> Path:
        """The node dir of `name`."""
        return self.state / name


@pytest.fixture
def hooks(tmp_path: Path) -> Hooks:
    """Both hooks and their library copied into tmp_path/hooks, a conf pointing into tmp_path."""
    d = tmp_path / "hooks"
    d.mkdir()
    for script in (PROLOG, EPILOG, LIBRARY):
        shutil.copy2(script, d)
    h = Hooks(dir=d, state=tmp_path / "state", log=tmp_path / "log" / "hooks.log")
    h.conf(f"STATE_DIR={h.state}\nLOG_FILE={h.log}\nSYSLOG=no\n")
    return h


def parse(path: Path) -> dict[str, str]:
    """A hook file's key=value lines as a dict (asserting no key repeats)."""
    lines = path.read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines]
    assert len({k for k, _ in pairs}) == len(pairs), lines
    return dict(pairs)


def names(path: Path) -> list[str]:
    """Sorted file names in `path` (empty when it does not exist)."""
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def all_files(path: Path) -> list[Path]:
    """Every regular file under `path`."""
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


@pytest.fixture
def mount_point(tmp_path: Path) -> Iterator[Path]:
    """An empty dir to mount on; unmounted afterwards. Skips when mount is not allowed."""
    m = tmp_path / "mnt"
    m.mkdir()
    probe = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(m)], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {probe.stderr!r}")
    subprocess.run(["umount", str(m)], check=True)
    yield m
    subprocess.run(["umount", str(m)], capture_output=True)


# --- prolog -------------------------------------------------------------------


def test_prolog_writes_one_binding_per_gpu(hooks: Hooks) -> None:
    """A 2-GPU job gets bindings/<job>.0 and bindings/<job>.1 with the job's fields."""
    result = hooks.run("prolog", JOB_ENV)

    assert 0 == result.returncode
    assert ["4242.0", "4242.1"] == names(hooks.node() / "bindings")
    expected = {
        "job_id": "4242",
        "gpu_index": "1",
        "uid": "1000",
        "user": "alice",
        "account": "physics",
        "partition": "gpu",
        "cluster": "testbed",
        "end": "1",
    }
    assert expected == parse(hooks.node() / "bindings" / "4242.1")
    assert "end=1\n" == (hooks.node() / "bindings" / "4242.0").read_text()[-6:]


def test_prolog_writes_started_event(hooks: Hooks) -> None:
    """The prolog writes events/<job>.started.<pid> listing the GPU indices."""
    hooks.run("prolog", JOB_ENV)

    [event] = names(hooks.node() / "events")
    assert event.startswith("4242.started.")
    assert event.removeprefix("4242.started.").isdigit()
    expected = {
        "job_id": "4242",
        "gpu_indices": "0,1",
        "uid": "1000",
        "user": "alice",
        "account": "physics",
        "partition": "gpu",
        "cluster": "testbed",
        "end": "1",
    }
    assert expected == parse(hooks.node() / "events" / event)


def test_prolog_end_marker_is_last_line(hooks: Hooks) -> None:
    """Every file the prolog writes ends with the completeness marker end=1."""
    hooks.run("prolog", JOB_ENV)

    lasts = {p.read_text().splitlines()[-1] for p in all_files(hooks.state)}
    assert {"end=1"} == lasts


def test_prolog_records_array_and_het_ids_when_set(hooks: Hooks) -> None:
    """Array and heterogeneous-job ids appear only when slurmd sets them."""
    env = {
        **JOB_ENV,
        "SLURM_ARRAY_JOB_ID": "4240",
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_HET_JOB_ID": "4241",
        "SLURM_HET_JOB_OFFSET": "1",
    }
    hooks.run("prolog", env)

    binding = parse(hooks.node() / "bindings" / "4242.0")
    expected = {
        "array_job_id": "4240",
        "array_task_id": "2",
        "het_job_id": "4241",
        "het_job_offset": "1",
    }
    assert expected == {k: binding[k] for k in expected}


def test_hooks_record_the_restart_count_of_a_requeued_job(hooks: Hooks) -> None:
    """SLURM_RESTART_COUNT (the run of a requeued job) is `restart` in every file."""
    env = {**JOB_ENV, "SLURM_RESTART_COUNT": "1"}
    hooks.run("prolog", env)
    binding = parse(hooks.node() / "bindings" / "4242.0")
    hooks.run("epilog", {**env, "SLURM_JOB_EXIT_CODE": "0"})
    events = [parse(hooks.node() / "events" / name) for name in names(hooks.node() / "events")]
    assert ["1", "1", "1"] == [binding["restart"], *(e["restart"] for e in events)]


# The GPU variables of a `--gres=shard:2` job's prolog on Slurm 22.05 (PrologFlags=Alloc),
# logged on the shapes bed (docker/slurm-cluster/shapes.sh, node gpu4): the same as a
# `--gres=gpu:a100:1` job's on that GPU. gres/shard's prolog environment is
# gres_common_epilog_set_env's (src/plugins/gres/shard/gres_shard.c, as on master), which
# sets only these; SLURM_SHARDS_ON_NODE is the job's own environment, not the prolog's.
SHARD_PROLOG_ENV_22_05 = {
    "CUDA_VISIBLE_DEVICES": "0",
    "GPU_DEVICE_ORDINAL": "0",
    "SLURM_JOB_GPUS": "0",
    "SLURMD_NODENAME": "gpu4",
    "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
}


def test_prolog_of_a_shard_job_binds_its_gpu_and_claims_no_shards(hooks: Hooks) -> None:
    """A shard job's prolog (Slurm 22.05's environment) binds its GPU's index, no shard keys.

    Nothing there tells shards from a whole GPU, so the hook claims neither `shards` nor
    `shard_kind` (slurm_gpu/node/hookfiles.py's keys): the agent asks Slurm, never guesses.
    """
    hooks.run("prolog", {**JOB_ENV, **SHARD_PROLOG_ENV_22_05})

    binding = parse(hooks.node("gpu4") / "bindings" / "4242.0")
    [event] = names(hooks.node("gpu4") / "events")
    started = parse(hooks.node("gpu4") / "events" / event)
    assert ("0", "0") == (binding["gpu_index"], started["gpu_indices"])
    assert set() == {"shards", "shard_kind"} & (set(binding) | set(started))


def test_prolog_without_array_ids_writes_no_array_keys(hooks: Hooks) -> None:
    """A plain job's files carry no array_*/het_* keys."""
    hooks.run("prolog", JOB_ENV)

    keys = set(parse(hooks.node() / "bindings" / "4242.0"))
    assert set() == {k for k in keys if k.startswith(("array_", "het_", "restart"))}


def test_prolog_expands_gpu_ranges(hooks: Hooks) -> None:
    """SLURM_JOB_GPUS written as a range (0-2,5) yields one binding per index."""
    hooks.run("prolog", {**JOB_ENV, "SLURM_JOB_GPUS": "0-2,5"})

    assert ["4242.0", "4242.1", "4242.2", "4242.5"] == names(hooks.node() / "bindings")


def test_prolog_without_gpus_writes_event_only(hooks: Hooks) -> None:
    """A job without GPUs gets no binding, but a started event with empty gpu_indices."""
    env = {k: v for k, v in JOB_ENV.items() if k not in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")}
    result = hooks.run("prolog", env)

    assert 0 == result.returncode
    assert [] == names(hooks.node() / "bindings")
    [event] = names(hooks.node() / "events")
    assert "" == parse(hooks.node() / "events" / event)["gpu_indices"]


def test_prolog_with_empty_job_gpus_writes_no_binding(hooks: Hooks) -> None:
    """SLURM_JOB_GPUS set but empty means no GPUs (CUDA_VISIBLE_DEVICES is not consulted)."""
    hooks.run("prolog", {**JOB_ENV, "SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": "NoDevFiles"})

    assert [] == names(hooks.node() / "bindings")


# --- epilog -------------------------------------------------------------------


def test_epilog_removes_only_this_jobs_bindings(hooks: Hooks) -> None:
    """The epilog of job 42 removes 42.* and leaves jobs 4242 and 421 alone."""
    hooks.run("prolog", {**JOB_ENV, "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1"})
    hooks.run("prolog", {**JOB_ENV, "SLURM_JOB_ID": "4242", "SLURM_JOB_GPUS": "2"})
    hooks.run("prolog", {**JOB_ENV, "SLURM_JOB_ID": "421", "SLURM_JOB_GPUS": "3"})

    result = hooks.run("epilog", {**JOB_ENV, "SLURM_JOB_ID": "42", "SLURM_JOB_EXIT_CODE": "0"})

    assert 0 == result.returncode
    assert ["421.3", "4242.2"] == names(hooks.node() / "bindings")


def test_epilog_writes_ended_event_with_exit_code(hooks: Hooks) -> None:
    """The epilog writes events/<job>.ended.<pid> with SLURM_JOB_EXIT_CODE."""
    hooks.run("epilog", {**JOB_ENV, "SLURM_JOB_EXIT_CODE": "256"})

    [event] = names(hooks.node() / "events")
    assert event.startswith("4242.ended.")
    expected = {
        "job_id": "4242",
        "gpu_indices": "0,1",
        "uid": "1000",
        "user": "alice",
        "account": "physics",
        "partition": "gpu",
        "cluster": "testbed",
        "exit_code": "256",
        "end": "1",
    }
    assert expected == parse(hooks.node() / "events" / event)


def test_epilog_non_digit_exit_code_is_empty(hooks: Hooks) -> None:
    """An exit code that is not digits is recorded empty, never copied."""
    hooks.run("epilog", {**JOB_ENV, "SLURM_JOB_EXIT_CODE": "0:9"})

    [event] = names(hooks.node() / "events")
    assert "" == parse(hooks.node() / "events" / event)["exit_code"]


def test_epilog_without_gpus_writes_ended_event(hooks: Hooks) -> None:
    """A job without GPUs still gets an ended event, and nothing fails."""
    env = {k: v for k, v in JOB_ENV.items() if k not in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")}
    result = hooks.run("epilog", {**env, "SLURM_JOB_EXIT_CODE": "0"})

    assert 0 == result.returncode
    assert ["events"] == [p.name for p in hooks.node().iterdir() if any(p.iterdir())]
    assert not hooks.log.exists()


def test_prolog_then_epilog_leaves_two_events_and_no_binding(hooks: Hooks) -> None:
    """A whole job leaves a started and an ended event and no binding."""
    hooks.run("prolog", JOB_ENV)
    hooks.run("epilog", {**JOB_ENV, "SLURM_JOB_EXIT_CODE": "0"})

    kinds = sorted(n.split(".")[1] for n in names(hooks.node() / "events"))
    assert (["ended", "started"], []) == (kinds, names(hooks.node() / "bindings"))


# --- failures: exit 0, nothing partial, one log line ---------------------------


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_uncreatable_state_dir_exits_0_and_logs(hooks: Hooks, tmp_path: Path, hook: str) -> None:
    """STATE_DIR under a regular file cannot be created even by root: exit 0, logged."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a dir\n")
    hooks.conf(f"STATE_DIR={blocker}/state\nLOG_FILE={hooks.log}\nSYSLOG=no\n")

    result = hooks.run(hook, JOB_ENV)

    assert (0, "") == (result.returncode, result.stderr)
    assert [] == all_files(tmp_path / "a-file-does-not-hide-anything")
    [line] = hooks.log.read_text().splitlines()
    assert f"slurm-gpu-{hook}: node=gpu1 job=4242: cannot create {blocker}/state/gpu1" in line


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_read_only_state_dir_exits_0_and_logs(hooks: Hooks, mount_point: Path, hook: str) -> None:
    """A read-only filesystem (EROFS stops root too): exit 0, nothing written, logged."""
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount_point)], check=True
    )
    hooks.conf(f"STATE_DIR={mount_point}\nLOG_FILE={hooks.log}\nSYSLOG=no\n")

    result = hooks.run(hook, JOB_ENV)

    assert (0, []) == (result.returncode, all_files(mount_point))
    assert "cannot create" in hooks.log.read_text()


def test_full_disk_prolog_exits_0_leaves_no_partial_file(hooks: Hooks, mount_point: Path) -> None:
    """On a full filesystem the prolog exits 0, removes what it began, and logs."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mount_point)], check=True)
    for sub in ("bindings", "events"):
        (mount_point / "gpu1" / sub).mkdir(parents=True)
    filler = mount_point / "filler"
    with filler.open("wb") as f, pytest.raises(OSError):
        f.write(b"x" * 65536)  # fills the 4k tmpfs
    hooks.conf(f"STATE_DIR={mount_point}\nLOG_FILE={hooks.log}\nSYSLOG=no\n")

    result = hooks.run("prolog", JOB_ENV)

    assert (0, [filler]) == (result.returncode, all_files(mount_point))
    assert "disk full" in hooks.log.read_text()


def test_full_disk_epilog_exits_0_leaves_no_partial_event(hooks: Hooks, mount_point: Path) -> None:
    """On a full filesystem the epilog exits 0, leaves no empty ended event, and logs."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mount_point)], check=True)
    for sub in ("bindings", "events"):
        (mount_point / "gpu1" / sub).mkdir(parents=True)
    filler = mount_point / "filler"
    with filler.open("wb") as f, pytest.raises(OSError):
        f.write(b"x" * 65536)
    hooks.conf(f"STATE_DIR={mount_point}\nLOG_FILE={hooks.log}\nSYSLOG=no\n")

    result = hooks.run("epilog", {**JOB_ENV, "SLURM_JOB_EXIT_CODE": "0"})

    assert (0, [filler]) == (result.returncode, all_files(mount_point))
    assert "no ended event" in hooks.log.read_text()


def test_failure_also_goes_to_syslog_when_enabled(hooks: Hooks, tmp_path: Path) -> None:
    """With SYSLOG=yes (the default) a failure still lands in LOG_FILE and exits 0."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    hooks.conf(f"STATE_DIR={blocker}/x\nLOG_FILE={hooks.log}\n")

    result = hooks.run("prolog", JOB_ENV)

    assert 0 == result.returncode
    assert 1 == len(hooks.log.read_text().splitlines())


def test_log_dir_is_created_on_first_failure(hooks: Hooks, tmp_path: Path) -> None:
    """A missing LOG_FILE directory is created when there is something to log."""
    log = tmp_path / "new" / "deeper" / "hooks.log"
    hooks.conf(f"STATE_DIR={tmp_path / 'a-file'}/x\nLOG_FILE={log}\nSYSLOG=no\n")
    (tmp_path / "a-file").write_text("")

    hooks.run("prolog", JOB_ENV)

    assert 1 == len(log.read_text().splitlines())


def test_happy_path_logs_nothing(hooks: Hooks) -> None:
    """Success writes no log line (and no log file)."""
    hooks.run("prolog", JOB_ENV)
    hooks.run("epilog", {**JOB_ENV, "SLURM_JOB_EXIT_CODE": "0"})

    assert not hooks.log.exists()


# --- config --------------------------------------------------------------------


def test_broken_conf_lines_are_ignored_and_logged(hooks: Hooks) -> None:
    """Garbage, a line without '=' and binary junk are skipped; valid keys still apply."""
    junk = b"\x00\xff\xfe binary \x01\n"
    hooks.dir.joinpath("slurm-gpu-hooks.conf").write_bytes(
        b"# comment\n\nno equals sign here\n"
        + junk
        + f"STATE_DIR={hooks.state}\nLOG_FILE={hooks.log}\nSYSLOG=no\nUNKNOWN_KEY=1\n".encode()
        + b"bad key=1\n=empty key"
    )

    result = hooks.run("prolog", JOB_ENV)

    assert 0 == result.returncode
    assert ["4242.0", "4242.1"] == names(hooks.node() / "bindings")
    [line] = hooks.log.read_text().splitlines()
    assert line.endswith("malformed line(s) 3 4 9 10 ignored"), line


def test_relative_state_dir_falls_back_and_logs(hooks: Hooks) -> None:
    """A STATE_DIR that is not an absolute plain path is refused and logged."""
    hooks.conf(f"LOG_FILE={hooks.log}\nSYSLOG=no\nSTATE_DIR=relative/dir\n")

    result = hooks.run("prolog", {**JOB_ENV, "SLURM_JOB_ID": ""})  # write nothing anywhere

    assert 0 == result.returncode
    assert "STATE_DIR is not an absolute path" in hooks.log.read_text()
    assert not (hooks.dir / "relative").exists()


def test_conf_is_parsed_not_sourced(hooks: Hooks, tmp_path: Path) -> None:
    """Shell code in the conf is never run."""
    marker = tmp_path / "pwned"
    hooks.conf(
        f"STATE_DIR={hooks.state}\nLOG_FILE={hooks.log}\nSYSLOG=no\n"
        f"touch {marker}\nX=$(touch {marker})\n`touch {marker}`\n"
    )

    result = hooks.run("prolog", JOB_ENV)

    assert (0, False) == (result.returncode, marker.exists())


def test_missing_conf_uses_defaults_silently(tmp_path: Path) -> None:
    """Without a conf next to it (and none in /etc) the hook still exits 0."""
    if Path("/etc/slurm-gpu/hooks.conf").exists():
        pytest.skip("a real /etc/slurm-gpu/hooks.conf is installed")
    shutil.copy2(PROLOG, tmp_path)
    shutil.copy2(LIBRARY, tmp_path)
    result = subprocess.run(
        ["/bin/sh", str(tmp_path / "slurm-gpu-prolog")],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert (0, "") == (result.returncode, result.stdout)


# --- environment ---------------------------------------------------------------


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_empty_environment_exits_0_writes_nothing_logs(hooks: Hooks, hook: str) -> None:
    """With no Slurm variables at all: exit 0, no file, one log line naming SLURM_JOB_ID."""
    result = hooks.run(hook, {})

    assert (0, []) == (result.returncode, all_files(hooks.state))
    assert "SLURM_JOB_ID missing or not digits" in hooks.log.read_text()


def test_only_job_id_gives_files_with_empty_fields(hooks: Hooks) -> None:
    """Missing user/account/... are recorded empty; the node falls back to the hostname."""
    result = hooks.run("prolog", {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "3"})

    hostname = Path("/proc/sys/kernel/hostname").read_text().strip().split(".")[0]
    binding = hooks.state / hostname / "bindings" / "7.3"
    assert 0 == result.returncode
    expected = {
        "job_id": "7",
        "gpu_index": "3",
        "uid": "",
        "user": "",
        "account": "",
        "partition": "",
        "cluster": "",
        "end": "1",
    }
    assert expected == parse(binding)


def test_hostile_values_are_sanitized(hooks: Hooks) -> None:
    """Newlines and shell syntax in user/account cannot add lines or run code."""
    env = {
        **JOB_ENV,
        "SLURM_JOB_ACCOUNT": "x\nend=1\njob_id=999",
        "SLURM_JOB_USER": "bob smith$(id)`id`;|&",
        "SLURM_JOB_PARTITION": "gpu\r\n",
        "SLURM_JOB_UID": "1000\nuid=0",
    }
    hooks.run("prolog", env)

    binding = parse(hooks.node() / "bindings" / "4242.0")
    expected = {
        "account": "xend1job_id999",
        "user": "bobsmithidid",
        "partition": "gpu",
        "uid": "",
        "job_id": "4242",
    }
    assert expected == {k: binding[k] for k in expected}
    assert 8 == len((hooks.node() / "bindings" / "4242.0").read_text().splitlines())


def test_hostile_values_are_never_executed(hooks: Hooks, tmp_path: Path) -> None:
    """Command substitutions in any variable are data, never run."""
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker})`touch {marker}`"
    env = {k: v + evil for k, v in JOB_ENV.items()}
    hooks.run("prolog", env)
    hooks.run("epilog", {**env, "SLURM_JOB_EXIT_CODE": evil})

    assert not marker.exists()


def test_bad_gpu_entries_are_dropped(hooks: Hooks) -> None:
    """Non-digit GPU entries (a path, a glob, a UUID) never become file names."""
    hooks.run("prolog", {**JOB_ENV, "SLURM_JOB_GPUS": "0,../x,*,GPU-1234,2"})

    assert ["4242.0", "4242.2"] == names(hooks.node() / "bindings")


@pytest.mark.parametrize("job_id", ["12/../../x", "12 13", "-1", "1e3", "*"])
def test_bad_job_id_writes_nothing(hooks: Hooks, job_id: str) -> None:
    """A job id that is not digits writes nothing and is logged."""
    result = hooks.run("prolog", {**JOB_ENV, "SLURM_JOB_ID": job_id})

    assert (0, []) == (result.returncode, all_files(hooks.state))
    assert "SLURM_JOB_ID missing or not digits" in hooks.log.read_text()


@pytest.mark.parametrize("node", ["../escape", ".hidden", "..", "a/../../b"])
def test_node_name_cannot_escape_state_dir(hooks: Hooks, tmp_path: Path, node: str) -> None:
    """A node name with '/' or a leading '.' never leaves STATE_DIR or hides a dir."""
    hooks.run("prolog", {**JOB_ENV, "SLURMD_NODENAME": node})

    ours = [hooks.state, hooks.log.parent, hooks.dir]
    outside = [p for p in all_files(tmp_path) if not any(d in p.parents for d in ours)]
    node_dirs = {p.relative_to(hooks.state).parts[0] for p in all_files(hooks.state)}
    assert ([], set()) == (outside, {d for d in node_dirs if d.startswith(".")})


def test_several_nodes_on_one_host_write_separate_dirs(hooks: Hooks) -> None:
    """Two slurmd on one host (gpu1, gpu2) keep separate bindings for the same GPU index."""
    hooks.run(
        "prolog", {**JOB_ENV, "SLURMD_NODENAME": "gpu1", "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0"}
    )
    hooks.run(
        "prolog", {**JOB_ENV, "SLURMD_NODENAME": "gpu2", "SLURM_JOB_ID": "2", "SLURM_JOB_GPUS": "0"}
    )
    hooks.run("epilog", {**JOB_ENV, "SLURMD_NODENAME": "gpu1", "SLURM_JOB_ID": "1"})

    assert ([], ["2.0"]) == (
        names(hooks.node("gpu1") / "bindings"),
        names(hooks.node("gpu2") / "bindings"),
    )


# --- the scripts themselves ------------------------------------------------------


@pytest.mark.parametrize("script", [PROLOG, EPILOG], ids=["prolog", "epilog"])
def test_script_is_posix_sh_without_python(script: Path) -> None:
    """The hooks start with #!/bin/sh, never mention python, and are executable."""
    text = script.read_text()

    assert (True, False, True) == (
        text.startswith("#!/bin/sh\n"),
        "python" in text.lower(),
        os.access(script, os.X_OK),
    )


def test_library_is_posix_sh_without_python_and_not_a_hook() -> None:
    """The library says it is sh (for shellcheck), never mentions python, runs nothing.

    It is not executable, so a prolog.d glob that catches it does not run it as a hook.
    """
    text = LIBRARY.read_text()

    assert (True, False, False) == (
        text.startswith("# shellcheck shell=sh\n"),
        "python" in text.lower(),
        os.access(LIBRARY, os.X_OK),
    )


@pytest.mark.parametrize("script", [PROLOG, EPILOG, LIBRARY], ids=["prolog", "epilog", "library"])
def test_script_parses_with_dash(script: Path) -> None:
    """`sh -n` (dash on Debian) finds no syntax error."""
    result = subprocess.run(["/bin/sh", "-n", str(script)], capture_output=True, text=True)

    assert (0, "") == (result.returncode, result.stderr)


def test_prolog_happy_path_runs_no_external_program(hooks: Hooks, tmp_path: Path) -> None:
    """Once the dirs exist, the prolog executes nothing but itself (strace execve count)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace not installed")
    hooks.run("prolog", {**JOB_ENV, "SLURM_JOB_ID": "1"})  # creates the dirs
    trace = tmp_path / "trace"
    subprocess.run(
        [
            strace,
            "-f",
            "-e",
            "trace=execve",
            "-o",
            str(trace),
            "/bin/sh",
            str(hooks.dir / "slurm-gpu-prolog"),
        ],
        env={"PATH": "/usr/bin:/bin", **JOB_ENV},
        check=True,
        capture_output=True,
    )
    execs = [line for line in trace.read_text().splitlines() if "execve(" in line]
    assert 1 == len(execs), execs


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_missing_library_exits_0_writes_nothing_and_says_so(hooks: Hooks, hook: str) -> None:
    """Without its library a hook still exits 0, writes nothing, and names it on stderr.

    The library is looked for next to the hook, then where conf/slurm-hooks.md installs it.
    """
    if INSTALLED_LIBRARY.exists():
        pytest.skip(f"{INSTALLED_LIBRARY} is installed")
    (hooks.dir / LIBRARY.name).unlink()

    result = hooks.run(hook, {**JOB_ENV, "SLURM_JOB_EXIT_CODE": "0"})

    assert (0, []) == (result.returncode, all_files(hooks.state))
    assert f"slurm-gpu-{hook}: job=4242: slurm-gpu-hooks.sh not found" in result.stderr


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_broken_library_still_exits_0(hooks: Hooks, hook: str) -> None:
    """A library that is damaged (a syntax error, a truncated copy) cannot fail the job."""
    (hooks.dir / LIBRARY.name).write_text("hook_begin() {\n")

    result = hooks.run(hook, {**JOB_ENV, "SLURM_JOB_EXIT_CODE": "0"})

    assert (0, []) == (result.returncode, all_files(hooks.state))


def test_epilog_happy_path_runs_only_rm(hooks: Hooks, tmp_path: Path) -> None:
    """Besides itself the epilog executes one program, the rm of the job's bindings."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace not installed")
    hooks.run("prolog", JOB_ENV)
    trace = tmp_path / "trace"
    epilog = str(hooks.dir / "slurm-gpu-epilog")
    subprocess.run(
        [strace, "-f", "-e", "trace=execve", "-o", str(trace), "/bin/sh", epilog],
        env={"PATH": "/usr/bin:/bin", **JOB_ENV, "SLURM_JOB_EXIT_CODE": "0"},
        check=True,
        capture_output=True,
    )
    execs = [line for line in trace.read_text().splitlines() if "execve(" in line]
    assert ["/bin/sh", "/bin/rm"] == [line.split('"')[1] for line in execs]


def test_hooks_and_library_are_shellcheck_clean() -> None:
    """shellcheck (following the sourced library) finds nothing in the hooks."""
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed")
    result = subprocess.run(
        [shellcheck, "-x", str(PROLOG), str(EPILOG), str(LIBRARY)], capture_output=True, text=True
    )

    assert (0, "") == (result.returncode, result.stdout)
