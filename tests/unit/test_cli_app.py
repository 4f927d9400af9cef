"""The CLI's `App`: built from the config only when a command needs it, closed after."""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner, Result

from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.store import Store

BROKEN = Path(__file__).resolve().parents[1] / "data" / "configs" / "syntax_error.toml"


def run(args: list[str], tmp_path: Path) -> Result:
    """Invoke the CLI with no default config file and an empty environment."""
    app = AppContext(env={}, default_path=tmp_path / "absent.toml")
    return CliRunner().invoke(cli, args, obj=app)


def sqlite_config(tmp_path: Path) -> Path:
    """A config file whose store is a SQLite file under tmp_path, cluster "alpha"."""
    path = tmp_path / "slurm-gpu.toml"
    path.write_text(f'[cluster]\nname = "alpha"\n[store]\nurl = "sqlite:///{tmp_path}/s.db"\n')
    return path


def test_db_with_an_explicit_url_does_not_read_a_broken_config(tmp_path: Path) -> None:
    """`db upgrade --url URL` works even when the config file would not load."""
    url = f"sqlite:///{tmp_path / 'other.db'}"
    result = run(["--config", str(BROKEN), "db", "upgrade", "--url", url], tmp_path)
    head = Store.head_revision()
    assert (0, f"{url}: schema upgraded (empty) -> {head}\n") == (result.exit_code, result.output)


def test_sacct_helpformat_needs_no_config(tmp_path: Path) -> None:
    """`sacct --helpformat` lists the fields with a broken config file."""
    result = run(["--config", str(BROKEN), "sacct", "--helpformat"], tmp_path)
    assert (0, True) == (result.exit_code, "JobID" in result.output)


def test_a_broken_config_is_one_error_line_when_a_service_is_needed(tmp_path: Path) -> None:
    """A command that needs the store reports the config error on one line, exit 1."""
    result = run(["--config", str(BROKEN), "audit"], tmp_path)
    expected = (1, f"slurm-gpu: {BROKEN}: line 3, column 13: Invalid value\n")
    assert expected == (result.exit_code, result.stderr)


def test_exempt_writes_through_the_configured_store(tmp_path: Path) -> None:
    """`exempt` stores the exemption in [store] url, under [cluster] name."""
    config = sqlite_config(tmp_path)
    assert 0 == run(["--config", str(config), "db", "upgrade"], tmp_path).exit_code
    result = run(
        ["--config", str(config), "exempt", "7", "--for", "1h", "--reason", "demo"], tmp_path
    )
    with Store(f"sqlite:///{tmp_path}/s.db", cluster="alpha") as store:
        stored = [(e.kind, e.target, e.reason) for e in store.control.exemptions()]
    assert (0, [("job", "7", "demo")]) == (result.exit_code, stored)


def test_the_app_is_closed_with_the_outermost_click_context(tmp_path: Path) -> None:
    """The App a command used is closed (its store's pool disposed) when the CLI ends."""
    app_context = AppContext(config_path=sqlite_config(tmp_path), env={})
    with click.Context(cli, obj=app_context) as ctx:
        app = app_context.app(ctx)
        app.store.ping()
        pool = app.store.engine.pool
    assert pool is not app.store.engine.pool
