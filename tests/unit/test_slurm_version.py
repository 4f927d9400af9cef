"""The Slurm release slurm-gpu talks to: parsing, the tested matrix, --version, config check."""

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from slurm_gpu import __version__
from slurm_gpu.cli import config_cmd
from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.config import Config, load_config
from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm.runner import SlurmCommands
from slurm_gpu.slurm.version import (
    TESTED_RELEASES,
    describe_slurm,
    parse_version,
    query_version,
    untested_warning,
)
from slurm_gpu.testing import CommandFailure, FakeRunner

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("output", "text", "release"),
    [
        ("slurm 22.05.8\n", "22.05.8", "22.05"),
        ("slurm-wlm 24.11.5\n", "24.11.5", "24.11"),  # Debian's build
        ("slurm-wlm 26.05.5\n", "26.05.5", "26.05"),
        ("slurm 23.11.0-0rc1\n", "23.11.0-0rc1", "23.11"),
        ("scontrol: debug: x\nslurm 25.11.2\n", "25.11.2", "25.11"),
        ("slurm 9.3\n", "9.3", "09.03"),
    ],
)
def test_parse_version(output: str, text: str, release: str) -> None:
    """The version and its release (major.minor) from each form Slurm's commands print."""
    version = parse_version(output)
    assert (text, release) == (version.text, version.release)


@pytest.mark.parametrize("output", ["", "scontrol: fatal: no config\n", "slurm x.y\n"])
def test_parse_version_refuses_what_is_no_version(output: str) -> None:
    """Output without `slurm X.Y` is an error that quotes it, never a guessed release."""
    with pytest.raises(SlurmError, match="unrecognised Slurm version output"):
        parse_version(output)


def test_tested_releases_are_the_test_beds() -> None:
    """The matrix is the releases local-cluster can run (release-root.sh's case)."""
    launcher = (REPO / "docker" / "slurm-cluster" / "release-root.sh").read_text()
    assert ("22.05", "24.11", "26.05") == TESTED_RELEASES
    for release in TESTED_RELEASES:
        assert f"    {release})" in launcher


@pytest.mark.parametrize("output", ["slurm 22.05.8", "slurm-wlm 24.11.5", "slurm 26.05.0"])
def test_no_warning_for_a_tested_release(output: str) -> None:
    assert untested_warning(parse_version(output)) is None


@pytest.mark.parametrize(
    ("output", "release"), [("slurm 23.11.4", "23.11"), ("slurm 27.05.1", "27.05")]
)
def test_a_release_outside_the_matrix_is_warned_about(output: str, release: str) -> None:
    """Warned, naming the release and the tested ones: a warning, not an error."""
    warning = untested_warning(parse_version(output))
    expected = f"Slurm {release} is not a release slurm-gpu is tested on (22.05, 24.11, 26.05)"
    assert warning is not None and warning.startswith(expected)


def test_query_asks_scontrol_first() -> None:
    runner = FakeRunner({("scontrol", "--version"): "slurm 24.11.5\n", ("sinfo",): "slurm 1.0"})
    assert ("24.11.5", ["scontrol --version"]) == (query_version(runner).text, runner.commands())


def test_query_falls_back_to_sinfo() -> None:
    """A site without scontrol on the path (or a broken one) still gets its release."""
    runner = FakeRunner(
        {
            ("scontrol",): CommandFailure(127, stderr="not found"),
            ("sinfo", "--version"): "slurm 26.05.5\n",
        }
    )
    version = query_version(runner)
    assert ("26.05.5", ["scontrol --version", "sinfo --version"]) == (
        version.text,
        runner.commands(),
    )


def test_describe_an_unreachable_slurm() -> None:
    """Both commands failing: `Slurm not reachable: <scontrol's error>`, no warning."""
    runner = FakeRunner({(): CommandFailure(1, stderr="scontrol: fatal: no configuration")})
    expected = (
        "Slurm not reachable: scontrol --version failed (exit 1): "
        "scontrol: fatal: no configuration",
        None,
    )
    assert expected == describe_slurm(runner)


def test_describe_a_missing_program() -> None:
    """The real runner, with a bin_dir that has no Slurm: not reachable, says why."""
    line, warning = describe_slurm(SlurmCommands(bin_dir="/nonexistent/slurm/bin"))
    assert line.startswith("Slurm not reachable: cannot run /nonexistent/slurm/bin/scontrol")
    assert warning is None


def test_version_runner_follows_the_slurm_section(tmp_path: Path) -> None:
    """[slurm] bin_dir and conf reach the runner; its timeout is at most 10 s."""
    path = tmp_path / "slurm-gpu.toml"
    path.write_text(
        '[slurm]\nbin_dir = "/opt/slurm/bin"\nconf = "/etc/x.conf"\ncommand_timeout = "60s"\n'
    )
    expected = SlurmCommands(bin_dir="/opt/slurm/bin", timeout=10.0, conf="/etc/x.conf")
    assert expected == config_cmd.slurm_runner(load_config(path, env={}))
    assert SlurmCommands(timeout=10.0) == config_cmd.slurm_runner(None)


def cli_with(
    runner: FakeRunner, monkeypatch: pytest.MonkeyPatch, args: list[str], tmp_path: Path
) -> Result:
    monkeypatch.setattr(config_cmd, "slurm_runner", lambda _config: runner)
    app = AppContext(env={}, default_path=tmp_path / "absent.toml")
    return CliRunner().invoke(cli, args, obj=app)


def test_version_warns_on_an_untested_release(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`slurm-gpu --version` on Slurm 23.11: the release on stdout, a warning, exit 0."""
    runner = FakeRunner({("scontrol", "--version"): "slurm 23.11.10\n"})
    result = cli_with(runner, monkeypatch, ["--version"], tmp_path)
    expected_out = (
        f"slurm-gpu {__version__}\nSlurm 23.11.10 (tested releases: 22.05, 24.11, 26.05)\n"
    )
    assert (0, expected_out) == (result.exit_code, result.stdout)
    assert result.stderr.startswith("warning: Slurm 23.11 is not a release slurm-gpu is tested on")


def test_version_when_slurm_is_not_reachable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No Slurm: --version still prints slurm-gpu's version and exits 0."""
    runner = FakeRunner(
        {(): CommandFailure(1, stderr="fatal: Could not establish a configuration source")}
    )
    result = cli_with(runner, monkeypatch, ["--version"], tmp_path)
    expected = (
        0,
        f"slurm-gpu {__version__}\nSlurm not reachable: scontrol --version failed (exit 1): "
        "fatal: Could not establish a configuration source\n",
        "",
    )
    assert expected == (result.exit_code, result.stdout, result.stderr)


def test_version_with_a_broken_config_uses_the_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--version works with a config it cannot read: Slurm's commands on $PATH."""
    broken = tmp_path / "broken.toml"
    broken.write_text("[node\n")
    seen: list[Config | None] = []
    runner = FakeRunner({("scontrol", "--version"): "slurm 22.05.8\n"})

    def runner_for(config: Config | None) -> FakeRunner:
        seen.append(config)
        return runner

    monkeypatch.setattr(config_cmd, "slurm_runner", runner_for)
    app = AppContext(env={"SLURM_GPU_CONFIG": str(broken)}, default_path=tmp_path / "absent.toml")
    result = CliRunner().invoke(cli, ["--version"], obj=app)
    assert (0, [None]) == (result.exit_code, seen)
    assert result.stdout.endswith("Slurm 22.05.8 (tested releases: 22.05, 24.11, 26.05)\n")


def test_config_check_names_the_release_and_warns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """config check: the TOML's first line names the release; untested: a warning, exit 0."""
    runner = FakeRunner({("scontrol", "--version"): "slurm 25.05.3\n"})
    result = cli_with(runner, monkeypatch, ["config", "check"], tmp_path)
    first = result.stdout.splitlines()[0]
    assert (0, "# Slurm 25.05.3 (tested releases: 22.05, 24.11, 26.05)") == (
        result.exit_code,
        first,
    )
    assert result.stderr.splitlines() == [
        "warning: " + str(untested_warning(parse_version("slurm 25.05.3"))),
        "config OK: defaults",
    ]
