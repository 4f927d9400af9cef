"""Captures the Slurm output slurm-gpu parses, from a running test bed, into tests/data/<release>/.

    eval "$(docker/slurm-cluster/local-cluster --slurm 24.11 env)"
    /opt/slurm-gpu/venv/bin/python -m tests.data.capture_release

Submits a few jobs as the test bed's users (alice: 2 GPUs on gpu1 with an odd name and a
comment; bob: a 2-task GPU array on gpu2; carol: a pending GPU job and a finished one),
waits until they run, writes what each command printed, and cancels them. The files are
the release's real output, read by tests/unit/test_release_parsers.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from slurm_gpu.slurm import sacct, scontrol, squeue

DATA = Path(__file__).resolve().parent


def run(*argv: str, user: str | None = None) -> str:
    """Runs a Slurm command with the test bed's environment (as `user` when given)."""
    cmd = list(argv)
    if user is not None:
        cmd = ["runuser", "-u", user, "--whitelist-environment=SLURM_CONF,PATH", "--", *cmd]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout


def optional(*argv: str) -> str | None:
    """Output of a command this release may lack (22.05: no `scontrol --json`)."""
    try:
        return run(*argv)
    except subprocess.CalledProcessError:
        return None


def submit(user: str, *args: str, wrap: str) -> int:
    """sbatch as `user` in the test bed's job directory; the job id."""
    jobs = Path(os.environ["SLURM_GPU_CLUSTER_DIR"]) / "jobs"
    out = run(
        "sbatch", "--parsable", f"--chdir={jobs}", f"--output={jobs}/%j.out", *args,
        f"--wrap={wrap}", user=user,
    )  # fmt: skip
    return int(out.strip().split(";")[0])


def state(job: int) -> str:
    """The job's state from squeue ("" once it is gone)."""
    return (optional("squeue", "-h", "-j", str(job), "-o", "%T") or "").strip()


def main() -> int:
    """Submits, captures, cancels; prints the directory written."""
    release = os.environ.get("SLURM_GPU_SLURM_RELEASE", "22.05")
    out = DATA / release
    out.mkdir(exist_ok=True)
    done = submit("carol", "--gres=gpu:1", "--account=bio", wrap="true")
    jobs = [
        submit(
            "alice", "--gres=gpu:2", "-w", "gpu1", "--job-name=<b>odd</b> ünï|x",
            "--comment=capture", "--time=30", wrap="sleep 300",
        ),
        submit("bob", "--gres=gpu:1", "-w", "gpu2", "--array=0-1", wrap="sleep 300"),
        submit("carol", "--gres=gpu:1", "--begin=now+1hour", "--account=physics", wrap="true"),
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (
                state(jobs[0]) == "RUNNING"
                and run("squeue", "-h", "-r", "-t", "R", "-u", "bob").count("\n") == 2
            ):
                break
            time.sleep(1)
        while state(done) not in ("", "COMPLETED") and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(5)  # slurmdbd records a job's start a moment after it starts
        files = {
            "squeue.json": run("squeue", "--json"),
            "squeue-format.txt": run(*squeue.format_argv(["RUNNING", "PENDING"])),
            "squeue-owners.txt": run(*squeue.OWNERS_ARGV),
            "scontrol-d-show-job.txt": run("scontrol", "-d", "show", "job"),
            "scontrol-d-show-job.json": optional("scontrol", "-d", "show", "job", "--json"),
            "scontrol-o-show-node.txt": run(*scontrol.NODE_GPUS_ARGV),
            "scontrol-show-config.txt": run(*scontrol.CONFIG_ARGV),
            "sinfo-nodes.txt": run(*scontrol.sinfo_argv()),
            "sacct.txt": run(*sacct.sacct_argv(jobs=[str(done), str(jobs[0])])),
            "sacct.json": optional("sacct", "--json", "-j", f"{done},{jobs[0]}"),
        }
        for name, text in files.items():
            if text is not None:
                (out / name).write_text(text)
        (out / "jobs.json").write_text(
            json.dumps(
                {"finished": done, "alice": jobs[0], "bob_array": jobs[1], "pending": jobs[2]}
            )
            + "\n"
        )
    finally:
        run("scancel", *map(str, jobs))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
