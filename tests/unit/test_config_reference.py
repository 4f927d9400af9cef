"""`slurm-gpu config reference` and docs/config-reference.md, generated from the schema."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from slurm_gpu.cli.config_cmd import render_reference
from slurm_gpu.cli.main import cli
from slurm_gpu.config import SettingDoc, describe_schema
from tests.toml_keys import commented_examples, leaf_keys

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "config-reference.md"
EXAMPLE = REPO / "conf" / "slurm-gpu.toml"


def reference_output() -> str:
    """What `slurm-gpu config reference` prints."""
    result = CliRunner().invoke(cli, ["config", "reference"])
    assert (0, "") == (result.exit_code, result.stderr)
    return result.stdout


def documented_keys(markdown: str) -> set[str]:
    """Dotted keys of a reference: each `## [section]` heading plus its table's rows."""
    keys: set[str] = set()
    section = ""
    for line in markdown.splitlines():
        heading = re.fullmatch(r"## `\[\[?([^\]]+)\]\]?`", line)
        if heading:
            section = heading.group(1)
            keys.add(section)
            continue
        row = re.match(r"\| `([^`]+)` \|", line)
        if row:
            keys.add(f"{section}.{row.group(1)}" if section else row.group(1))
    return keys


def test_committed_reference_is_the_generated_one() -> None:
    """docs/config-reference.md equals the command's output: it cannot drift from the schema.

    Regenerate: slurm-gpu config reference > docs/config-reference.md.
    """
    assert reference_output() == REFERENCE.read_text()


def test_reference_is_markdown() -> None:
    """The reference is Markdown (its one format, so there is no --format to choose)."""
    expected = "# slurm-gpu configuration reference"
    assert expected == reference_output().splitlines()[0]


def test_format_option_is_gone() -> None:
    """`--format` (which offered only markdown) is a usage error that names the option."""
    result = CliRunner().invoke(cli, ["config", "reference", "--format", "markdown"])
    assert (2, True) == (result.exit_code, "'--format'" in result.stderr)


def test_reference_documents_every_schema_key() -> None:
    """Every key describe_schema() knows has a heading or a row in the reference."""
    expected = {e.key for e in describe_schema()}
    assert expected == documented_keys(reference_output())


def test_every_example_config_key_is_documented() -> None:
    """Every key set in conf/slurm-gpu.toml is in the generated reference.

    That includes the keys of its commented-out [[quota]] example.
    """
    text = EXAMPLE.read_text()
    values = frozenset(e.key for e in describe_schema() if e.type.startswith("table of "))
    example: dict[str, Any] = tomllib.loads(text)
    keys = leaf_keys(example, values=values) | leaf_keys(commented_examples(text), values=values)
    missing = sorted(keys - documented_keys(REFERENCE.read_text()))
    assert [] == missing


def test_reference_rows_show_type_default_and_doc() -> None:
    """A key's row carries its type, its default as TOML and its one-line doc."""
    entries = [
        SettingDoc("node", "table", "", "The node agent."),
        SettingDoc("node.interval", "duration", '"10s"', "How often GPUs are sampled."),
    ]
    expected = '| `interval` | duration | `"10s"` | How often GPUs are sampled. |'
    assert expected in render_reference(entries).splitlines()


def test_required_key_and_pipe_in_doc() -> None:
    """A key without default reads "(required)"; a `|` in a doc cannot break the table."""
    entries = [
        SettingDoc("quota", "array of tables", "", "Budgets."),
        SettingDoc("quota.limit", "number", "", "GPU-hours | job-hours."),
    ]
    lines = render_reference(entries).splitlines()
    expected = ("## `[[quota]]`", "| `limit` | number | (required) | GPU-hours \\| job-hours. |")
    assert expected == (lines[lines.index("## `[[quota]]`")], lines[-1])
