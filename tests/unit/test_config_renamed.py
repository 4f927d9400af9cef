"""Renamed config keys (`RENAMED_KEYS`): the old name is read for one release, with a warning.

The one renamed key today is `[reports] hot_node_factor` -> `busy_node_factor`.
"""

import logging
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from slurm_gpu.config import Config, doc, load_config, parse_settings
from slurm_gpu.errors import ConfigError

SCRIPT = Path(sys.executable).parent / "slurm-gpu"
LOADER_LOG = "slurm_gpu.config._loader"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def deprecations(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOADER_LOG]


def test_old_name_is_read_as_the_new_one_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """hot_node_factor still sets busy_node_factor, and a warning names file:key and the new key."""
    path = write(tmp_path, "[reports]\nhot_node_factor = 2.5\n")
    config = load_config(path, env={})
    expected = (
        2.5,
        [
            (
                logging.WARNING,
                f"{path}: reports.hot_node_factor: deprecated; renamed reports.busy_node_factor:"
                " write busy_node_factor (the old name is read until the next release)",
            )
        ],
    )
    assert expected == (config.reports.busy_node_factor, deprecations(caplog))


def test_new_name_is_read_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """busy_node_factor sets the factor and logs nothing."""
    config = load_config(write(tmp_path, "[reports]\nbusy_node_factor = 3\n"), env={})
    assert (3.0, []) == (config.reports.busy_node_factor, deprecations(caplog))


def test_default_is_unchanged() -> None:
    """Without either key the factor is 1.5, as it was under the old name."""
    assert 1.5 == Config().reports.busy_node_factor


def test_setting_both_names_is_an_error(tmp_path: Path) -> None:
    """Old and new name together: one problem naming the file and both keys."""
    path = write(tmp_path, "[reports]\nhot_node_factor = 2\nbusy_node_factor = 3\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    expected = [
        f"{path}: reports.hot_node_factor: the deprecated name of reports.busy_node_factor,"
        " which is set too; remove hot_node_factor"
    ]
    assert expected == caught.value.problems


def test_old_name_is_validated_under_the_key_as_written(tmp_path: Path) -> None:
    """A bad value under the old name is reported at the old key, with the new key's limits."""
    path = write(tmp_path, "[reports]\nhot_node_factor = 0\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    expected = [f"{path}: reports.hot_node_factor: must be greater than 0, got 0 (integer)"]
    assert expected == caught.value.problems


@dataclass(frozen=True)
class Required:
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"old": "new"}

    new: int = field(metadata=doc("A required key with a former name."))


@dataclass(frozen=True)
class Root:
    inner: Required = field(default_factory=lambda: Required(0), metadata=doc("A section."))


def test_required_key_given_by_its_old_name_is_not_missing() -> None:
    """The generic loader counts a required key set by its old name as given."""
    assert Root(Required(7)) == parse_settings(Root, tomllib.loads("[inner]\nold = 7\n"), "x")


def test_config_check_prints_the_deprecation(tmp_path: Path) -> None:
    """`slurm-gpu config check` passes, shows the warning and renders the new name."""
    path = write(tmp_path, "[reports]\nhot_node_factor = 2.0\n")
    proc = subprocess.run(
        [str(SCRIPT), "config", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    warning = (
        f"{path}: reports.hot_node_factor: deprecated; renamed reports.busy_node_factor:"
        " write busy_node_factor (the old name is read until the next release)"
    )
    expected = (0, True, [warning, f"config OK: {path}"])
    actual = (proc.returncode, "busy_node_factor = 2.0" in proc.stdout, proc.stderr.splitlines())
    assert expected == actual
