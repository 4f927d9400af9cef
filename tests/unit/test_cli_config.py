"""The `slurm-gpu` entry point and `slurm-gpu config check`."""

import shutil
import socket
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from slurm_gpu import __version__
from slurm_gpu.cli import config_cmd
from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import SlurmGpuGroup, cli
from slurm_gpu.config import CONFIG_ENV_VAR, Config, load_config, parse_settings, render_config
from slurm_gpu.errors import StoreError
from slurm_gpu.models import GpuDevice
from slurm_gpu.testing import FakeRunner

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "data" / "configs"
SCRIPT = Path(sys.executable).parent / "slurm-gpu"


# What `config check` and `--version` say of the Slurm they reach (slurm_release fixture).
SLURM_LINE = "Slurm 24.11.5 (tested releases: 22.05, 24.11, 26.05)"


@pytest.fixture
def slurm_release(monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    """Slurm 24.11.5 answers the CLI's version query (no real scontrol is run)."""
    runner = FakeRunner({("scontrol", "--version"): "slurm 24.11.5\n"})
    monkeypatch.setattr(config_cmd, "slurm_runner", lambda _config: runner)
    return runner


def no_gres_line(config: Config) -> str:
    """What `config check` says where [node] gres_conf is not on this machine."""
    node = socket.gethostname().split(".")[0]
    return f"# gres.conf: {config.node.gres_conf} is not here: {node}'s GPU numbering not checked\n"


def run(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> Result:
    """Invoke the CLI with no real default config file and a controlled environment."""
    app = AppContext(env=env or {}, default_path=tmp_path / "absent.toml")
    return CliRunner().invoke(cli, args, obj=app)


# Each broken file and the exact dotted key (with the start of the explanation) that
# `config check` must name.
BROKEN = [
    ("unknown_key", "node.intervall: unknown key; did you mean 'interval'?"),
    ("wrong_type", "node.ship_batch_size: expected an integer"),
    ("bool_as_int", "node.missing_after_intervals: expected an integer, got true (boolean)"),
    ("negative_duration", "node.interval: a duration must not be negative"),
    ("zero_interval", "node.interval: must be greater than 0"),
    ("bad_duration_text", "slurm.command_timeout: unknown unit 'seconds'"),
    ("duration_units_out_of_order", "store.readings_retention: units out of order"),
    ("percent_150", "node.active_threshold_percent: must be between 0 and 100, got 150"),
    ("bad_url_scheme", "store.url: unsupported database URL"),
    ("bad_log_level", 'logging.level: expected one of "DEBUG", "INFO", "WARNING", "ERROR"'),
    ("syntax_error", "line 3, column 13: Invalid value"),
    ("unknown_section", "nodes: unknown section; did you mean 'node'?"),
    ("list_for_string", "cluster.name: expected a string, got"),
    ("section_not_table", "node: expected a table [node]"),
    ("float_for_int", "node.ship_batch_size: expected an integer, got 2.5 (float)"),
    ("bad_metrics_address", 'node.metrics_address: expected "host:port"'),
    ("empty_path", "node.state_dir: expected a path"),
    ("duration_as_bool", "store.ship_aggregate: expected a duration"),
]


@pytest.mark.parametrize(("name", "expected"), BROKEN, ids=[name for name, _ in BROKEN])
def test_check_rejects_broken_config(tmp_path: Path, name: str, expected: str) -> None:
    """`config check --config F` exits 1 and names the file and the dotted key on stderr."""
    path = CONFIGS / f"{name}.toml"
    result = run(["config", "check", "--config", str(path)], tmp_path)
    expected_exit = (1, "")
    assert expected_exit == (result.exit_code, result.stdout)
    assert result.stderr.startswith(f"slurm-gpu: {path}: {expected}")


def test_check_reports_every_problem_on_its_own_line(tmp_path: Path) -> None:
    """Several problems give several `slurm-gpu: <file>: <key>: ...` lines."""
    path = CONFIGS / "several_problems.toml"
    result = run(["config", "check", "--config", str(path)], tmp_path)
    keys = [line.split(": ")[2] for line in result.stderr.splitlines()]
    expected = ["node.interval", "node.active_threshold_percent", "logging.level"]
    assert (1, expected) == (result.exit_code, keys)


def test_check_missing_explicit_file_fails(tmp_path: Path) -> None:
    """A --config file that does not exist is an error, not a silent fallback."""
    missing = tmp_path / "missing.toml"
    result = run(["config", "check", "--config", str(missing)], tmp_path)
    expected = (1, f"slurm-gpu: {missing}: No such file or directory\n")
    assert expected == (result.exit_code, result.stderr)


def test_check_valid_file_prints_effective_config(
    tmp_path: Path, slurm_release: FakeRunner
) -> None:
    """A valid file: its effective config as TOML on stdout, "config OK: <path>" on stderr.

    The TOML starts with comments naming the Slurm release the config reaches and what
    was checked of this node's gres.conf.
    """
    path = CONFIGS / "valid.toml"
    result = run(["config", "check", "--config", str(path)], tmp_path)
    config = load_config(path, env={})
    toml = f"# {SLURM_LINE}\n" + no_gres_line(config) + render_config(config)
    expected = (0, toml, f"config OK: {path}\n")
    assert expected == (result.exit_code, result.stdout, result.stderr)


def test_check_output_loads_back_to_same_config(tmp_path: Path) -> None:
    """What `config check` prints is itself a valid config with the same values."""
    path = CONFIGS / "valid.toml"
    result = run(["config", "check", "--config", str(path)], tmp_path)
    printed = parse_settings(Config, tomllib.loads(result.stdout), "stdout")
    assert load_config(path, env={}) == printed


def test_check_without_any_file_uses_defaults(tmp_path: Path, slurm_release: FakeRunner) -> None:
    """No --config, no $SLURM_GPU_CONFIG, no default file: defaults, "config OK: defaults"."""
    result = run(["config", "check"], tmp_path)
    head = f"# {SLURM_LINE}\n" + no_gres_line(Config())
    expected = (0, head + render_config(Config()), "config OK: defaults\n")
    assert expected == (result.exit_code, result.stdout, result.stderr)


def test_check_uses_env_var(tmp_path: Path) -> None:
    """$SLURM_GPU_CONFIG names the file when --config is absent."""
    path = CONFIGS / "valid.toml"
    result = run(["config", "check"], tmp_path, env={CONFIG_ENV_VAR: str(path)})
    assert (0, f"config OK: {path}\n") == (result.exit_code, result.stderr)


def test_check_reads_process_environment(tmp_path: Path) -> None:
    """Without an injected env, $SLURM_GPU_CONFIG comes from the process environment."""
    path = CONFIGS / "valid.toml"
    app = AppContext(default_path=tmp_path / "absent.toml")
    result = CliRunner().invoke(cli, ["config", "check"], obj=app, env={CONFIG_ENV_VAR: str(path)})
    assert (0, f"config OK: {path}\n") == (result.exit_code, result.stderr)


def test_group_config_option_beats_env_var(tmp_path: Path) -> None:
    """`slurm-gpu --config F config check` uses F even when $SLURM_GPU_CONFIG is set."""
    path = CONFIGS / "valid.toml"
    env = {CONFIG_ENV_VAR: str(CONFIGS / "unknown_key.toml")}
    result = run(["--config", str(path), "config", "check"], tmp_path, env=env)
    assert (0, f"config OK: {path}\n") == (result.exit_code, result.stderr)


def test_check_config_option_beats_group_option(tmp_path: Path) -> None:
    """`config check --config F` wins over the group's --config."""
    path = CONFIGS / "valid.toml"
    broken = CONFIGS / "unknown_key.toml"
    result = run(["--config", str(broken), "config", "check", "--config", str(path)], tmp_path)
    assert (0, f"config OK: {path}\n") == (result.exit_code, result.stderr)


def test_help_works_with_broken_config(tmp_path: Path) -> None:
    """The config is loaded only by commands that need it, so --help never fails on it."""
    broken = CONFIGS / "syntax_error.toml"
    result = run(["--config", str(broken), "config", "--help"], tmp_path)
    expected = 0
    assert expected == result.exit_code


def test_version(tmp_path: Path, slurm_release: FakeRunner) -> None:
    """--version prints `slurm-gpu <version>`, then the Slurm release it talks to."""
    result = run(["--version"], tmp_path)
    expected = (0, f"slurm-gpu {__version__}\n{SLURM_LINE}\n", "")
    assert expected == (result.exit_code, result.stdout, result.stderr)


def test_app_context_loads_config_once(tmp_path: Path) -> None:
    """AppContext.config is read on first use and then reused."""
    path = tmp_path / "c.toml"
    path.write_text('[cluster]\nname = "first"\n')
    app = AppContext(config_path=path, env={})
    first = app.config
    path.write_text('[cluster]\nname = "second"\n')
    assert ("first", first) == (app.config.cluster.name, app.config)


def test_slurm_gpu_error_becomes_one_line_and_exit_1() -> None:
    """A SlurmGpuError from any command: `slurm-gpu: <message>` on stderr, exit 1."""

    @click.group(cls=SlurmGpuGroup)
    def group() -> None:
        """A stand-in for `cli`."""

    @group.command()
    def fail() -> None:
        raise StoreError("database is locked")

    result = CliRunner().invoke(group, ["fail"])
    expected = (1, "slurm-gpu: database is locked\n", SystemExit)
    assert expected == (result.exit_code, result.stderr, type(result.exception))


def test_other_errors_keep_their_traceback() -> None:
    """An unexpected exception is a bug and is not turned into a one-liner."""

    @click.group(cls=SlurmGpuGroup)
    def group() -> None:
        """A stand-in for `cli`."""

    @group.command()
    def crash() -> None:
        raise KeyError("bug")

    result = CliRunner().invoke(group, ["crash"])
    assert isinstance(result.exception, KeyError)


def test_console_script_reports_broken_config(tmp_path: Path) -> None:
    """The installed `slurm-gpu` script: exit 1, file and key on stderr, no traceback."""
    path = CONFIGS / "bool_as_int.toml"
    proc = subprocess.run(
        [str(SCRIPT), "config", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    expected = (
        1,
        "",
        f"slurm-gpu: {path}: node.missing_after_intervals: "
        "expected an integer, got true (boolean)\n",
    )
    assert expected == (proc.returncode, proc.stdout, proc.stderr)


def test_console_script_checks_example_config() -> None:
    """The installed script accepts conf/slurm-gpu.toml."""
    path = REPO / "conf" / "slurm-gpu.toml"
    proc = subprocess.run(
        [str(SCRIPT), "config", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (0, f"config OK: {path}\n") == (proc.returncode, proc.stderr)


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder every user can enter (pytest's own tmp folders are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="slurm-gpu-cred-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def config_check_warnings(config: Path) -> list[str]:
    """The warning lines of `slurm-gpu config check --config CONFIG` (which must succeed)."""
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "slurm-gpu"),
            "config",
            "check",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("warning:")]


def test_check_warns_when_the_store_password_is_world_readable(open_folder: Path) -> None:
    """A config with a database password, mode 0644: config check says how to fix it."""
    config = open_folder / "slurm-gpu.toml"
    config.write_text('[store]\nurl = "postgresql://slurmgpu:s3cret@db.example/slurm_gpu"\n')
    config.chmod(0o644)
    (warning,) = config_check_warnings(config)
    assert "readable by every user" in warning and "chmod 0640" in warning
    config.chmod(0o640)
    assert [] == config_check_warnings(config)
    config.chmod(0o644)
    open_folder.chmod(0o750)  # a closed folder protects the file too
    assert [] == config_check_warnings(config)


def test_check_warns_when_the_sqlite_store_is_world_readable(open_folder: Path) -> None:
    """A SQLite store anyone can read is the same leak: the fix is a closed folder."""
    store_dir = open_folder / "store"
    store_dir.mkdir(mode=0o755)
    database = store_dir / "accounting.db"
    database.write_bytes(b"")
    database.chmod(0o644)
    config = open_folder / "slurm-gpu.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{database}"\n')
    (warning,) = config_check_warnings(config)
    assert f"{database}: the SQLite store is readable by every user" in warning
    assert f"chmod 0750 {store_dir}" in warning
    store_dir.chmod(0o750)
    assert [] == config_check_warnings(config)


# --- the node's GPU numbering (gres.conf, AutoDetect) -------------------------------------

NVML_GPUS = [  # NVML order: minors 2, 0, 3, 1
    GpuDevice(f"GPU-minor{m}", "NVIDIA A100-SXM4-80GB", m, n, "", None)
    for n, m in enumerate((2, 0, 3, 1))
]


def gres_check(tmp_path: Path, gres_conf: str, gpus: list[GpuDevice] | None) -> Result:
    """`config check --node gpu1` with this gres.conf, where NVML lists `gpus`."""
    (tmp_path / "gres.conf").write_text(gres_conf)
    config = tmp_path / "slurm-gpu.toml"
    config.write_text(f'[node]\ngres_conf = "{tmp_path / "gres.conf"}"\n')
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config_cmd, "nvml_devices", lambda: gpus)
        runner = FakeRunner({("scontrol", "--version"): "slurm 24.11.5\n"})
        patch.setattr(config_cmd, "slurm_runner", lambda _c: runner)
        return run(["config", "check", "--config", str(config), "--node", "gpu1"], tmp_path)


def test_check_prints_slurmds_numbering_of_an_autodetect_node(tmp_path: Path) -> None:
    result = gres_check(tmp_path, "NodeName=gpu1 AutoDetect=nvidia Name=gpu Count=4\n", NVML_GPUS)
    assert result.exit_code == 0, result.output
    assert (
        f"# gres.conf {tmp_path / 'gres.conf'}, node gpu1: AutoDetect=nvidia: device minor order\n"
        "#   Slurm GPU 0 = /dev/nvidia0 GPU-minor0\n"
        "#   Slurm GPU 1 = /dev/nvidia1 GPU-minor1\n"
        "#   Slurm GPU 2 = /dev/nvidia2 GPU-minor2\n"
        "#   Slurm GPU 3 = /dev/nvidia3 GPU-minor3\n"
    ) in result.stdout
    nvml = gres_check(tmp_path, "AutoDetect=nvml\n", NVML_GPUS)
    assert "#   Slurm GPU 0 = /dev/nvidia2 GPU-minor2\n" in nvml.stdout


def test_check_fails_on_a_gres_conf_the_agent_cannot_map(tmp_path: Path) -> None:
    result = gres_check(tmp_path, "AutoDetect=full\n", NVML_GPUS)
    assert result.exit_code == 1
    assert "AutoDetect=full (line 1): this node's NVML order and device minor order differ" in (
        result.stderr
    )
    assert "config OK" not in result.stderr


def test_check_without_nvml_checks_gres_conf_alone(tmp_path: Path) -> None:
    ok = gres_check(tmp_path, "AutoDetect=nvml\n", None)
    assert ok.exit_code == 0
    assert "#   NVML is not available here: the GPUs themselves were not checked\n" in ok.stdout
    amd = gres_check(tmp_path, "NodeName=gpu[1-2] AutoDetect=rsmi\n", None)
    assert amd.exit_code == 1
    assert "AutoDetect=rsmi (line 1) does not detect NVIDIA GPUs" in amd.stderr
    broken = gres_check(tmp_path, "AutoDetect=nvlm\n", None)
    assert broken.exit_code == 1
    assert "gres.conf: line 1: AutoDetect=nvlm: not one of" in broken.stderr
