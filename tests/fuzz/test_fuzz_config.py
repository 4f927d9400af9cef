"""Bad input to the config loader ends in a Config or a ConfigError naming the file."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from slurm_gpu.config import Config, describe_schema, parse_settings, read_config
from slurm_gpu.errors import ConfigError
from tests.fuzz.strategies import REPO, fuzz, mutated, toml_document, toml_values

EXAMPLE = REPO / "conf" / "slurm-gpu.toml"
SCHEMA = list(describe_schema())
LEAVES = [e for e in SCHEMA if e.type not in ("table", "array of tables", "table of tables")]


def _typed_value(kind: str) -> st.SearchStrategy[Any]:
    """Values of the type a key expects, so that fuzzing reaches the deeper checks."""
    small = st.integers(min_value=-5, max_value=10**6)
    if kind == "duration":
        units = st.sampled_from(["s", "m", "h", "d", "1h30m", "x", ""])
        text = st.builds(lambda n, u: f"{n}{u}", st.integers(-3, 10**6), units)
        return st.one_of(text, small, st.floats(), st.text(max_size=8))
    if kind == "integer":
        return st.one_of(small, st.integers())
    if kind == "number":
        return st.one_of(small, st.floats(), st.integers(min_value=2**1030))
    if kind == "boolean":
        return st.booleans()
    if kind.startswith("one of "):
        choices = json.loads("[" + kind.removeprefix("one of ") + "]")
        return st.one_of(st.sampled_from(choices), st.sampled_from(choices).map(str.lower))
    if kind.startswith("array of "):
        inner = kind.removeprefix("array of ").strip("()")
        inner = {"strings": "string", "numbers": "number", "durations": "duration"}.get(
            inner, inner
        )
        return st.lists(_typed_value(inner), max_size=3)
    if kind.startswith("table of "):
        inner = {"numbers": "number", "durations": "duration"}.get(
            kind.removeprefix("table of "), "string"
        )
        return st.dictionaries(st.text(max_size=6), _typed_value(inner), max_size=3)
    words = ["", "month", "week", "30d", "0d", "hold", "block", "qos:", "qos:low", "fairshare"]
    words += ["sqlite:///x.db", "postgresql://u:p@h/db", "ftp://x", ":9400", "[::]:0", "UTC"]
    words += ["Europe/Berlin", "Not/AZone", "../etc", "a\nb"]
    return st.one_of(st.sampled_from(words), st.text(max_size=12))


@st.composite
def schema_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A parsed TOML document built from the real schema's keys with random values.

    Most values have the key's type (to pass the type checks and reach the limits and
    the cross-key checks); some have a random type; some keys are unknown.
    """
    document: dict[str, Any] = {}
    quota: list[dict[str, Any]] = []
    for entry in draw(st.lists(st.sampled_from(LEAVES), max_size=12, unique=True)):
        typed = draw(st.integers(0, 3)) > 0
        value = draw(_typed_value(entry.type) if typed else toml_values)
        parts = entry.key.split(".")
        if parts[0] == "quota":
            for _ in range(draw(st.integers(1, 2)) - len(quota)):
                quota.append({})
            quota[draw(st.integers(0, len(quota) - 1))][parts[1]] = value
            continue
        table = document
        for part in parts[:-1]:
            table = table.setdefault(part, {})
        table[parts[-1]] = value
    if quota:
        document["quota"] = quota
    if draw(st.integers(0, 5)) == 0:
        document[draw(st.text(min_size=1, max_size=8))] = draw(toml_values)
    if draw(st.integers(0, 7)) == 0 and document:
        document[draw(st.sampled_from(sorted(document)))] = draw(toml_values)
    return document


def assert_names_the_file(error: ConfigError, source: str) -> None:
    """Every problem is one line that starts with `<source>: `."""
    assert error.problems
    for problem in error.problems:
        assert problem.startswith(f"{source}: "), problem
        assert "\n" not in problem, problem


@contextmanager
def config_file(data: bytes) -> Iterator[Path]:
    """A temporary slurm-gpu.toml holding `data`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "slurm-gpu.toml"
        path.write_bytes(data)
        yield path


def load(path: Path) -> Config | ConfigError:
    """read_config's result, or the ConfigError it raised."""
    try:
        return read_config(path)
    except ConfigError as exc:
        return exc


@fuzz(400)
@given(schema_documents())
@example({"node": {"active_threshold_percent": 10**400}})
@example({"cost": {"default_price": 2**1100}})
def test_schema_documents_give_config_or_config_error(document: dict[str, Any]) -> None:
    """parse_settings on any document over the schema's keys: a Config or a ConfigError.

    Every line of the error names the source.
    """
    try:
        config = parse_settings(Config, document, "fuzz.toml")
    except ConfigError as exc:
        assert_names_the_file(exc, "fuzz.toml")
    else:
        assert isinstance(config, Config)


@fuzz(150)
@given(schema_documents())
def test_schema_documents_as_files_give_config_or_config_error(document: dict[str, Any]) -> None:
    """The same documents written as TOML files: a Config or a ConfigError naming the file."""
    with config_file(toml_document(document).encode()) as path:
        result = load(path)
        if isinstance(result, ConfigError):
            assert_names_the_file(result, str(path))


@fuzz(150)
@given(st.binary(max_size=300))
@example(b"\xff\xfe")
@example(b"[node]\ninterval = ")
def test_random_bytes_file_gives_config_error(data: bytes) -> None:
    """A file of random bytes: defaults or a ConfigError naming the file, never a traceback.

    Defaults when the bytes happen to be an empty document.
    """
    with config_file(data) as path:
        result = load(path)
        if isinstance(result, ConfigError):
            assert_names_the_file(result, str(path))


@fuzz(150)
@given(mutated([EXAMPLE.read_text()]))
@example("[node]\nactive_threshold_percent = " + "9" * 400 + "\n")
def test_mutated_example_config_gives_config_or_config_error(text: str) -> None:
    """A mutated conf/slurm-gpu.toml gives a Config or a ConfigError naming the file.

    Mutations: lines deleted, duplicated, swapped, truncated, or junk inserted.
    """
    with config_file(text.encode("utf-8", errors="surrogatepass")) as path:
        result = load(path)
        if isinstance(result, ConfigError):
            assert_names_the_file(result, str(path))
