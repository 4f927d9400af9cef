"""Shared hypothesis settings and input strategies for the bad-input sweep.

Every fuzz test checks one contract: whatever the input, the code under test returns a
result or raises the module's documented, clear error (a SlurmGpuError subclass or a
documented one such as HookFileError), never any other exception. The settings are
fixed (derandomized, no example database, no deadline) so CI runs are repeatable and the
whole suite stays well under a minute on two cores.

For a deeper, random run (not CI): `SLURM_GPU_FUZZ_SCALE=20 SLURM_GPU_FUZZ_RANDOM=1
pytest tests/fuzz` multiplies every test's examples and draws a fresh seed.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
SLURM_DATA = REPO / "tests" / "data" / "slurm"
SACCT_DATA = REPO / "tests" / "data" / "sacct"


def fuzz(max_examples: int) -> settings:
    """Repeatable settings for one fuzz test: `@fuzz(200)`."""
    scale = float(os.environ.get("SLURM_GPU_FUZZ_SCALE", "1"))
    return settings(
        max_examples=max(1, int(max_examples * scale)),
        deadline=None,
        derandomize=os.environ.get("SLURM_GPU_FUZZ_RANDOM", "") != "1",
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def seeds(*paths: Path) -> list[str]:
    """The captured outputs the mutations start from (read as Slurm's runner would)."""
    return [path.read_text(encoding="utf-8", errors="replace") for path in paths]


# Text that has broken parsers before or sits at a boundary: Unicode digits that
# str.isdigit() accepts but int() may not, numbers too big for a float or too long for
# int(), Slurm's null spellings, separators, times before the epoch.
TOKENS = (
    "²",
    "٣",
    "\u0a67",  # GURMUKHI DIGIT ONE
    "9" * 25,
    "9" * 4400,
    "-1",
    "0",
    "Infinity",
    "NaN",
    "1e999",
    "N/A",
    "(null)",
    "None",
    "Unknown",
    "UNLIMITED",
    "",
    " ",
    "\t",
    "\n",
    "\r\n",
    "\x00",
    "\x1f",
    "\x1e",
    "|",
    ",",
    "=",
    ":",
    "-",
    "[",
    "]",
    "[0-3]",
    "[01-02,7]",
    "(IDX:",
    "(IDX:0-1)",
    ")",
    "JobId=",
    " JobName=",
    "   Nodes=gpu1 GRES=gpu:",
    "gres/gpu=",
    "gres/gpu:a100=",
    "0001-01-01T00:00:00",
    "9999-12-31T23:59:59",
    "1-00:00:00",
    "end=1",
    "\ufffd",
    "\U0001f600",
)

DELIMITERS = ("\x1f", "\x1e", "|", "\n", ",", "=", ":", " ", "-", "(", ")", "[", "]")

Mutation = Callable[[st.DrawFn, str], str]


def _lines_op(draw: st.DrawFn, text: str, kind: str) -> str:
    lines = text.split("\n")
    i = draw(st.integers(0, len(lines) - 1))
    if kind == "delete":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(i, lines[i])
    else:
        j = draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def _insert(draw: st.DrawFn, text: str, piece: str) -> str:
    at = draw(st.integers(0, len(text)))
    return text[:at] + piece + text[at:]


def _replace_span(draw: st.DrawFn, text: str, piece: str) -> str:
    at = draw(st.integers(0, len(text)))
    length = draw(st.integers(0, 12))
    return text[:at] + piece + text[at + length :]


MUTATIONS: tuple[Mutation, ...] = (
    lambda draw, text: _lines_op(draw, text, "delete"),
    lambda draw, text: _lines_op(draw, text, "duplicate"),
    lambda draw, text: _lines_op(draw, text, "swap"),
    lambda draw, text: text[: draw(st.integers(0, len(text)))],  # truncate
    lambda draw, text: _insert(draw, text, draw(st.sampled_from(TOKENS))),
    lambda draw, text: _replace_span(draw, text, draw(st.sampled_from(TOKENS))),
    lambda draw, text: _insert(
        draw, text, draw(st.binary(max_size=16)).decode("utf-8", errors="replace")
    ),
    lambda draw, text: _insert(draw, text, draw(st.binary(max_size=16)).decode("latin-1")),
    lambda draw, text: _insert(draw, text, draw(st.text(max_size=16))),
    lambda draw, text: text.replace(
        draw(st.sampled_from(DELIMITERS)), draw(st.sampled_from(DELIMITERS))
    ),
    lambda draw, text: re.sub(r"\d+", draw(st.sampled_from(TOKENS)), text, count=1),
)


@st.composite
def mutated(draw: st.DrawFn, texts: Sequence[str], max_mutations: int = 4) -> str:
    """One of `texts`, damaged by up to `max_mutations` random edits (or random text)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    text = draw(st.sampled_from(list(texts)))
    for _ in range(draw(st.integers(1, max_mutations))):
        mutation = draw(st.sampled_from(MUTATIONS))
        text = mutation(draw, text)
    return text


# --- JSON -------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(TOKENS),
    st.sampled_from(["RUNNING", "PENDING", "gpu:2", "gres/gpu:a100:1", "gpu[1-2]", "n[²]"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6), inner, max_size=3)
        | st.fixed_dictionaries({"set": st.booleans(), "infinite": st.booleans(), "number": inner})
    ),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


@st.composite
def mutated_json(draw: st.DrawFn, document: Any, max_mutations: int = 4) -> str:
    """`document` with random nodes replaced by random JSON values, or deleted."""
    document = json.loads(json.dumps(document))
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = _paths(document)
        path = draw(st.sampled_from(paths))
        value = draw(json_values)
        if not path:
            document = value
            continue
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return json.dumps(document)


# --- TOML -------------------------------------------------------------------------------


def toml_key(name: str) -> str:
    """A TOML key, quoted when it is not a bare key."""
    if re.fullmatch(r"[A-Za-z0-9_-]+", name):
        return name
    return json.dumps(name, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    """A Python value (as tomllib returns them) written as an inline TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        body = ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + body + " }" if body else "{}"
    raise TypeError(f"cannot write {value!r} as TOML")


def toml_document(table: dict[str, Any]) -> str:
    """A whole TOML document: one `key = inline value` line per top-level key."""
    return "".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in table.items())


toml_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(),
    st.text(max_size=20),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)),
    st.dates(),
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=5,
)
