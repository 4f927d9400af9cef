"""`slurm-gpu audit` and `slurm-gpu policy backtest`: bad -S/-E are usage errors."""

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli


def run(args: list[str], tmp_path: Path) -> Result:
    """Invoke the CLI with no real config file (nor store) behind it."""
    app = AppContext(env={}, default_path=tmp_path / "absent.toml")
    return CliRunner().invoke(cli, args, obj=app)


def test_audit_with_a_bad_starttime_is_a_usage_error_naming_the_option(tmp_path: Path) -> None:
    """`audit -S bogus` exits 2 with one message naming -S, not a traceback."""
    result = run(["audit", "-S", "bogus"], tmp_path)
    assert (2, None) == (result.exit_code, _unexpected(result))
    assert "-S/--starttime: invalid time specification 'bogus'" in result.output


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["policy", "backtest", "-S", "now+999999999999"], "-S/--starttime"),
        (["policy", "backtest", "-S", "now-1day", "-E", "uts²"], "-E/--endtime"),
        (["audit", "-E", "now+99999999999weeks"], "-E/--endtime"),
    ],
)
def test_out_of_range_times_are_usage_errors(tmp_path: Path, args: list[str], option: str) -> None:
    """Times beyond what a date can hold are usage errors naming the option."""
    result = run(args, tmp_path)
    assert (2, None) == (result.exit_code, _unexpected(result))
    assert f"{option}: invalid time specification" in result.output


def _unexpected(result: Result) -> BaseException | None:
    """The exception behind a non-zero exit, unless it is click's own SystemExit."""
    return None if isinstance(result.exception, SystemExit) else result.exception
