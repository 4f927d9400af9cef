"""`slurm-gpu mailprog` and hooks/slurm-gpu-mailprog as slurmctld runs them, on a SQLite store.

The mail of a GPU job that ended gets exactly what `slurm-gpu job N` prints; every other
mail goes on byte for byte; nothing slurm-gpu does wrong keeps Slurm's mail back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from email import message_from_bytes
from email.message import Message
from pathlib import Path

from click.testing import CliRunner, Result

from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.models import JobEvent, JobEventKind, JobGpuSummary
from slurm_gpu.store import Store

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "hooks" / "slurm-gpu-mailprog"
SLURM_GPU = Path(sys.executable).with_name("slurm-gpu")
T0 = 1_800_000_000.0
SUBJECT = "Slurm Job_id=7 Name=train Ended, Run time 00:01:00, COMPLETED, ExitCode 0"
ENDED = {"SLURM_JOB_ID": "7", "SLURM_JOB_MAIL_TYPE": "Ended", "SLURM_JOB_STATE": "COMPLETED"}
BEGAN = {"SLURM_JOB_ID": "7", "SLURM_JOB_MAIL_TYPE": "Began", "SLURM_JOB_STATE": "RUNNING"}


def write_config(tmp_path: Path, mailprog: str, store: str | None = None) -> Path:
    config = tmp_path / "slurm-gpu.toml"
    config.write_text(
        f'[cluster]\nname = "alpha"\n[store]\nurl = "{store or f"sqlite:///{tmp_path}/s.db"}"\n'
        f"[reports]\nlive_sacct = false\n[mailprog]\n{mailprog}\n"
    )
    return config


def add_job(tmp_path: Path, job_id: int = 7, summarized: bool = True) -> None:
    """Job `job_id` of alice on gpu1 with GPU 0, ended; its summary in the store if asked."""
    with Store(f"sqlite:///{tmp_path}/s.db", cluster="alpha") as store:
        store.upgrade()
        common = {"node": "gpu1", "job_id": job_id, "user": "alice"}
        store.add_events(
            [
                JobEvent(kind=JobEventKind.STARTED, time=T0, gpu_indices=(0,), **common),  # type: ignore[arg-type]
                JobEvent(kind=JobEventKind.ENDED, time=T0 + 60, exit_code=0, **common),  # type: ignore[arg-type]
            ]
        )
        if summarized:
            store.add_summaries(
                [
                    JobGpuSummary(
                        job_id=job_id, node="gpu1", gpu_uuid="GPU-0", gpu_model="A100",
                        start=T0, end=T0 + 60, gpu_seconds=60.0, util_mean_percent=50.0,
                        util_max_percent=60.0, active_seconds=60.0, mem_max_bytes=2**30,
                        mem_gib_seconds=60.0, energy_joules=600.0, reading_count=12,
                        missing_seconds=0.0, user="alice",
                    )
                ]
            )  # fmt: skip


def run(tmp_path: Path, args: list[str], env: dict[str, str], body: bytes = b"") -> Result:
    app = AppContext(env={}, default_path=tmp_path / "absent.toml")
    return CliRunner().invoke(cli, args, obj=app, env=env, input=body)


def mailprog(tmp_path: Path, config: Path, env: dict[str, str], body: bytes = b"") -> Result:
    return run(tmp_path, ["--config", str(config), "mailprog", "-s", SUBJECT, "alice"], env, body)


def outbox(tmp_path: Path) -> list[Message]:
    folder = tmp_path / "out"
    names = sorted(os.listdir(folder)) if folder.exists() else []
    return [message_from_bytes((folder / n).read_bytes()) for n in names]


def text_of(message: Message) -> str:
    payload = message.get_payload(decode=True)
    assert isinstance(payload, bytes)
    return payload.decode()


def fake_mail_program(tmp_path: Path) -> Path:
    """A mail program recording its arguments (NUL-separated) and its stdin."""
    program = tmp_path / "mail"
    program.write_text(
        f"#!/bin/sh\nprintf '%s\\0' \"$@\" >{tmp_path}/args\ncat >{tmp_path}/stdin\n"
    )
    program.chmod(0o755)
    return program


OUTBOX = 'outbox_dir = "{}/out"\ndetach = false'


def test_began_mail_goes_to_the_real_mail_program_byte_for_byte(tmp_path: Path) -> None:
    """A Began mail: the real mail program gets Slurm's arguments and stdin as they were."""
    program = fake_mail_program(tmp_path)
    config = write_config(tmp_path, f'real_mailprog = "{program}"')
    body = b"\x00 whatever Slurm writes \xff\n"
    result = mailprog(tmp_path, config, BEGAN, body)
    assert 0 == result.exit_code, result.output
    assert f"-s\0{SUBJECT}\0alice\0".encode() == (tmp_path / "args").read_bytes()
    assert body == (tmp_path / "stdin").read_bytes()


def test_ended_gpu_job_mail_carries_the_text_of_slurm_gpu_job(tmp_path: Path) -> None:
    """The Ended mail of a GPU job whose summary is in: Slurm's subject, then `job 7`'s text."""
    add_job(tmp_path)
    config = write_config(tmp_path, OUTBOX.format(tmp_path))
    result = mailprog(tmp_path, config, ENDED)
    assert 0 == result.exit_code, result.output
    (message,) = outbox(tmp_path)
    view = run(tmp_path, ["--config", str(config), "job", "7"], {})
    assert 0 == view.exit_code, view.output
    assert SUBJECT == message["Subject"]
    assert "alice" == message["To"]
    assert f"slurm-gpu job 7:\n\n{view.output}" == text_of(message)
    assert "GPU" in view.output and "50" in view.output  # the view itself, not an error


def test_ended_mail_without_the_summary_says_it_was_not_ready(tmp_path: Path) -> None:
    """Summaries not in the store after [mailprog] wait: the mail goes, saying so."""
    add_job(tmp_path, summarized=False)
    config = write_config(tmp_path, OUTBOX.format(tmp_path) + '\nwait = "0.3s"')
    result = mailprog(tmp_path, config, ENDED)
    assert 0 == result.exit_code, result.output
    (message,) = outbox(tmp_path)
    expected = "The GPU report was not ready within 0.3 s; run `slurm-gpu job 7`.\n"
    assert expected == text_of(message)


def test_ended_mail_of_a_job_without_gpus_is_unchanged(tmp_path: Path) -> None:
    """A job that held no GPU (unknown to the store, none in sacct): Slurm's mail as it is."""
    add_job(tmp_path, job_id=8)
    config = write_config(tmp_path, OUTBOX.format(tmp_path))
    result = mailprog(tmp_path, config, ENDED, b"Slurm's body\n")
    assert 0 == result.exit_code, result.output
    (message,) = outbox(tmp_path)
    assert SUBJECT == message["Subject"]
    assert "Slurm's body\n" == text_of(message)


def test_store_down_still_sends_slurms_mail_with_one_line(tmp_path: Path) -> None:
    """The store cannot be opened: the mail goes once, with one line about the report."""
    config = write_config(
        tmp_path, OUTBOX.format(tmp_path), store=f"sqlite:///{tmp_path}/no/such/dir/s.db"
    )
    result = mailprog(tmp_path, config, ENDED)
    assert 0 == result.exit_code, result.output
    (message,) = outbox(tmp_path)
    assert SUBJECT == message["Subject"]
    (line,) = text_of(message).splitlines()
    assert line.startswith("The GPU report could not be added (")
    assert line.endswith("; run `slurm-gpu job 7`.")


def test_broken_config_sends_nothing_and_exits_75(tmp_path: Path) -> None:
    """An invalid config: exit 75 with nothing sent, so the wrapper's fallback sends it."""
    config = tmp_path / "slurm-gpu.toml"
    config.write_text(f'[mailprog]\noutbox_dir = "{tmp_path}/out"\nwait = "1h"\n')
    result = mailprog(tmp_path, config, ENDED)
    assert 75 == result.exit_code
    assert [] == outbox(tmp_path)


def wrapper_run(
    tmp_path: Path, conf: str, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[bytes], float]:
    """The wrapper as slurmctld runs it: its conf next to it, stdin /dev/null, the job's env."""
    (tmp_path / "hooks").mkdir(exist_ok=True)
    wrapper = tmp_path / "hooks" / "slurm-gpu-mailprog"
    wrapper.write_bytes(WRAPPER.read_bytes())
    wrapper.chmod(0o755)
    (tmp_path / "hooks" / "slurm-gpu-mailprog.conf").write_text(conf)
    started = time.monotonic()
    done = subprocess.run(
        [str(wrapper), "-s", SUBJECT, "alice"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done, time.monotonic() - started


def test_wrapper_hands_the_mail_to_its_fallback_when_slurm_gpu_cannot(tmp_path: Path) -> None:
    """slurm-gpu refusing the mail (bad config): the fallback program gets Slurm's call."""
    program = fake_mail_program(tmp_path)
    config = tmp_path / "broken.toml"
    config.write_text("[mailprog\n")
    conf = f"SLURM_GPU={SLURM_GPU}\nCONFIG={config}\nFALLBACK={program}\n"
    done, _ = wrapper_run(tmp_path, conf, ENDED)
    assert 0 == done.returncode, done.stderr
    assert f"-s\0{SUBJECT}\0alice\0".encode() == (tmp_path / "args").read_bytes()


def test_wrapper_returns_at_once_and_the_detached_process_sends_one_mail(tmp_path: Path) -> None:
    """With detach: the wrapper is back before the wait ends; one mail arrives after it."""
    add_job(tmp_path, summarized=False)
    config = write_config(tmp_path, f'outbox_dir = "{tmp_path}/out"\nwait = "6s"')
    conf = f"SLURM_GPU={SLURM_GPU}\nCONFIG={config}\nLOG_FILE={tmp_path}/mailprog.log\n"
    done, took = wrapper_run(tmp_path, conf, ENDED)
    assert 0 == done.returncode, done.stderr
    assert took < 6.0
    assert [] == outbox(tmp_path)
    deadline = time.monotonic() + 30
    while not outbox(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # a second mail, were there one, would be as quick as the first
    (message,) = outbox(tmp_path)
    assert "not ready within 6 s" in text_of(message)
