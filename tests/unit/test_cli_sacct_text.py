"""`slurm-gpu sacct` keeps Slurm's State text and takes sacct's --delimiter (#11 item 11).

Slurm's sacct is a script printing a capture from the test bed (Slurm 22.05), so the
rows are sacct's own: job 276 is `CANCELLED by 0`, job 281's name holds a `|`.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from slurm_gpu.access import Caller
from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.store import Store

CAPTURE = Path(__file__).resolve().parents[1] / "data" / "sacct" / "sacct-22.05-x1f.txt"


def sacct(tmp_path: Path, *args: str) -> Result:
    """`slurm-gpu sacct ARGS` as root, over an empty store and the captured sacct."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "sacct"
    fake.write_text(f"#!/bin/sh\nexec cat '{CAPTURE}'\n")
    fake.chmod(0o755)
    config = tmp_path / "slurm-gpu.toml"
    url = f"sqlite:///{tmp_path}/s.db"
    config.write_text(f'[store]\nurl = "{url}"\n[slurm]\nbin_dir = "{bin_dir}"\n')
    with Store(url) as store:
        store.upgrade()
    app = AppContext(config_path=config, env={}, caller=Caller(0, "root"))
    return CliRunner().invoke(cli, ["sacct", *args], obj=app)


def test_state_says_who_cancelled_as_sacct_does(tmp_path: Path) -> None:
    """`CANCELLED by 0` stays `CANCELLED by 0`: the uid that cancelled is Slurm's text."""
    result = sacct(tmp_path, "-j", "276,270", "-P", "-n", "-o", "JobID,State")
    assert (0, "270|COMPLETED\n276|CANCELLED by 0\n") == (result.exit_code, result.output)


def test_state_filter_matches_the_state_name(tmp_path: Path) -> None:
    """`-s CA` still selects a job whose State is `CANCELLED by 0`."""
    result = sacct(tmp_path, "-j", "276,270", "-s", "CA", "-P", "-n", "-o", "JobID,State")
    assert (0, "276|CANCELLED by 0\n") == (result.exit_code, result.output)


def test_delimiter_separates_parsable_fields(tmp_path: Path) -> None:
    """`-P --delimiter=,`: a job name with `|` in it parses; the header uses it too."""
    result = sacct(tmp_path, "-j", "281", "-P", "--delimiter=,", "-o", "JobID,JobName,User")
    expected = "JobID,JobName,User\n281,<script>alert(1)</script> ü|x,alice\n"
    assert (0, expected) == (result.exit_code, result.output)


def test_delimiter_of_several_characters_with_parsable(tmp_path: Path) -> None:
    """sacct's `-p` ends every field with the delimiter; it may be several characters."""
    result = sacct(tmp_path, "-j", "270", "-p", "-n", "--delimiter=::", "-o", "JobID,User")
    assert (0, "270::alice::\n") == (result.exit_code, result.output)


def test_an_empty_delimiter_is_a_usage_error(tmp_path: Path) -> None:
    """`--delimiter=` would glue the fields together: refused, exit 2, naming the option."""
    result = sacct(tmp_path, "-j", "270", "-P", "--delimiter=")
    assert (2, True) == (result.exit_code, "--delimiter" in result.output)
