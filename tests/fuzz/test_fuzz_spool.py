"""Bad files in the hooks' spool directories and corrupted outbox rows.

Hook files (`events/`, `bindings/`) are parsed into models or rejected with a
HookFileError; read_events/read_bindings never raise on a bad file: it is skipped while
young and quarantined once older than the grace period, so nothing is lost and nothing
blocks the files behind it. Outbox payloads that do not decode are an OutboxError
(the one error the shipper moves a row to quarantine for), never a bare KeyError/
TypeError/JSONDecodeError that kills the shipping thread, nor another error that the
shipper would retry forever.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from slurm_gpu.models import (
    GpuInterval,
    JobEvent,
    JobEventKind,
    JobGpuSummary,
    Measurement,
    SlotKind,
)
from slurm_gpu.node import outbox
from slurm_gpu.node.hookfiles import (
    HookFileError,
    parse_binding,
    parse_event,
    read_bindings,
    read_events,
)
from slurm_gpu.node.outbox import OutboxError, decode_event, decode_interval, decode_summary
from tests.fuzz.strategies import TOKENS, fuzz, json_values, mutated_json

KEYS = (
    *("job_id", "gpu_index", "gpu_indices", "uid", "user", "account", "partition", "cluster"),
    *("array_job_id", "array_task_id", "het_job_id", "het_job_offset", "exit_code"),
)
VALUES = st.one_of(
    st.sampled_from(["42", "0", "0,1", "", "alice", "physics", "gpu", "256"]),
    st.sampled_from(TOKENS[:12]),
    st.text(max_size=10).filter(lambda s: "\n" not in s and "\r" not in s),
)


@st.composite
def hook_contents(draw: st.DrawFn) -> bytes:
    """What a hook file may hold: key=value lines (maybe complete), or random bytes."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=80))
    lines = [f"{k}={draw(VALUES)}" for k in draw(st.lists(st.sampled_from(KEYS), max_size=8))]
    if draw(st.integers(0, 5)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.text(max_size=10)))
    if draw(st.integers(0, 4)) > 0:
        lines.append("end=1")
    return "\n".join(lines).encode("utf-8", errors="surrogatepass") + b"\n" * draw(st.booleans())


_NAME_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="/\x00")
EVENT_NAMES = st.one_of(
    st.builds(
        lambda job, kind, pid: f"{job}.{kind}.{pid}",
        st.sampled_from(["42", "7", "²", "x", ""]),
        st.sampled_from(["started", "ended", "bogus", ""]),
        st.integers(1, 99999),
    ),
    st.text(_NAME_CHARS, min_size=1, max_size=30).filter(lambda s: not s.startswith(".")),
)
BINDING_NAMES = st.one_of(
    st.builds(lambda job, index: f"{job}.{index}", st.integers(1, 999), st.integers(0, 7)),
    st.text(_NAME_CHARS, min_size=1, max_size=30).filter(lambda s: not s.startswith(".")),
)


def _visible_name(name: str) -> bool:
    """Names the readers look at (they ignore dot files) that fit in a directory entry."""
    return not name.startswith(".") and len(name.encode()) < 200


EVENT_FILES = st.dictionaries(EVENT_NAMES.filter(_visible_name), hook_contents(), max_size=5)
BINDING_FILES = st.dictionaries(BINDING_NAMES.filter(_visible_name), hook_contents(), max_size=5)


def _write(directory: Path, files: dict[str, bytes]) -> None:
    directory.mkdir(parents=True)
    for name, content in files.items():
        (directory / name).write_bytes(content)


def _quarantined(directory: Path) -> set[str]:
    quarantine = directory / ".quarantine"
    return {p.name for p in quarantine.iterdir()} if quarantine.exists() else set()


@fuzz(150)
@given(hook_contents(), EVENT_NAMES.filter(_visible_name))
@example(b"job_id=\xc2\xb2\nend=1\n", "42.started.1")
@example(b"job_id=42\nuid=\xd9\xa3\nend=1\n", "42.ended.1")
def test_parse_event_gives_event_or_hook_file_error(content: bytes, name: str) -> None:
    """parse_event on any file: a JobEvent or a HookFileError naming the file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content)
        try:
            event = parse_event(path, "gpu1")
        except HookFileError as exc:
            assert str(path) in str(exc)
            return
        assert isinstance(event, JobEvent)


@fuzz(150)
@given(hook_contents(), BINDING_NAMES.filter(_visible_name))
@example(b"job_id=42\ngpu_index=\xc2\xb2\nend=1\n", "42.0")
def test_parse_binding_gives_binding_or_hook_file_error(content: bytes, name: str) -> None:
    """parse_binding on any file: a Binding or a HookFileError naming the file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(content)
        try:
            binding = parse_binding(path)
        except HookFileError as exc:
            assert str(path) in str(exc)
            return
        assert binding.job_id >= 0


@fuzz(100)
@given(EVENT_FILES)
@example({"42.started.1": b"job_id=\xc2\xb2\nend=1\n"})
def test_read_events_quarantines_bad_files_and_loses_none(files: dict[str, bytes]) -> None:
    """read_events past the grace period: every file is returned or quarantined.

    Each is an event or moved to .quarantine/; none raises, none disappears.
    """
    with tempfile.TemporaryDirectory() as tmp:
        node_dir = Path(tmp) / "gpu1"
        _write(node_dir / "events", files)
        found = read_events(node_dir, "gpu1", grace_seconds=0)
        returned = {e.path.name for e in found}
        assert set(files) == returned | _quarantined(node_dir / "events")
        assert not returned & _quarantined(node_dir / "events")


@fuzz(60)
@given(EVENT_FILES)
def test_read_events_skips_young_bad_files(files: dict[str, bytes]) -> None:
    """Within the grace period a bad event file is skipped and left in place.

    The hook may still be writing it.
    """
    with tempfile.TemporaryDirectory() as tmp:
        node_dir = Path(tmp) / "gpu1"
        _write(node_dir / "events", files)
        read_events(node_dir, "gpu1", grace_seconds=3600)
        left = {p.name for p in (node_dir / "events").iterdir() if not p.name.startswith(".")}
        assert (set(files), set()) == (left, _quarantined(node_dir / "events"))


@fuzz(100)
@given(BINDING_FILES)
@example({"42.0": b"job_id=42\ngpu_index=\xc2\xb2\nend=1\n"})
def test_read_bindings_quarantines_bad_files_and_loses_none(files: dict[str, bytes]) -> None:
    """read_bindings past the grace period: every file is a Binding or quarantined."""
    with tempfile.TemporaryDirectory() as tmp:
        node_dir = Path(tmp) / "gpu1"
        _write(node_dir / "bindings", files)
        found = read_bindings(node_dir, grace_seconds=0)
        left = {p.name for p in (node_dir / "bindings").iterdir() if not p.name.startswith(".")}
        assert len(found) == len(left)
        assert set(files) == left | _quarantined(node_dir / "bindings")


# --- outbox payloads ------------------------------------------------------------------

INTERVAL = GpuInterval(
    node="gpu1",
    gpu_uuid="GPU-0",
    period_start=60.0,
    period_end=120.0,
    job_id=42,
    util_mean_percent=50.0,
    util_max_percent=90.0,
    util_min_percent=10.0,
    util_sample_count=6,
    active_seconds=50.0,
    covered_seconds=60.0,
    mem_used_max_bytes=2**30,
    mem_total_bytes=2**34,
    power_mean_watts=250.0,
    energy_joules=15000.0,
    temperature_max_celsius=60.0,
    ecc_errors_total=0,
    unallocated_pids=(),
)
EVENT = JobEvent(
    node="gpu1",
    job_id=42,
    kind=JobEventKind.STARTED,
    time=60.0,
    user="alice",
    uid=1000,
    account="physics",
    partition="gpu",
    gpu_indices=(0, 1),
    exit_code=None,
)
SUMMARY = JobGpuSummary(
    job_id=42,
    node="gpu1",
    gpu_uuid="GPU-0",
    gpu_model="A100",
    start=60.0,
    end=120.0,
    gpu_seconds=60.0,
    util_mean_percent=50.0,
    util_max_percent=90.0,
    active_seconds=50.0,
    mem_max_bytes=2**30,
    mem_gib_seconds=60.0,
    energy_joules=15000.0,
    reading_count=6,
    missing_seconds=0.0,
)


def _payload(model: Any) -> dict[str, Any]:
    data = asdict(model)
    if "kind" in data:
        data["kind"] = data["kind"].value
    return data


DECODERS = (
    (decode_interval, GpuInterval, _payload(INTERVAL)),
    (decode_event, JobEvent, _payload(EVENT)),
    (decode_summary, JobGpuSummary, _payload(SUMMARY)),
)


def _decodes_or_clear_error(index: int, payload: str) -> None:
    decoder, model, _ = DECODERS[index]
    try:
        decoded = decoder(payload)
    except OutboxError:
        return
    assert isinstance(decoded, model)


def test_outbox_payloads_round_trip() -> None:
    """The seeds of the corruption tests decode back to their models."""
    assert (INTERVAL, EVENT, SUMMARY) == (
        decode_interval(json.dumps(_payload(INTERVAL))),
        decode_event(json.dumps(_payload(EVENT))),
        decode_summary(json.dumps(_payload(SUMMARY))),
    )


@fuzz(150)
@given(st.integers(0, 2).flatmap(lambda i: st.tuples(st.just(i), mutated_json(DECODERS[i][2]))))
@example((0, "{}"))
@example((1, '{"kind": "bogus"}'))
@example((2, "[]"))
def test_corrupted_outbox_payload_is_a_clear_error(case: tuple[int, str]) -> None:
    """An outbox payload with fields removed or replaced: its model or an OutboxError.

    Never KeyError/TypeError/AttributeError.
    """
    _decodes_or_clear_error(*case)


@fuzz(100)
@given(st.integers(0, 2), st.one_of(st.text(max_size=40), json_values.map(json.dumps)))
@example(0, "{")
@example(1, "null")
def test_garbage_outbox_payload_is_a_clear_error(index: int, payload: str) -> None:
    """An outbox payload that is not the model's JSON at all: an OutboxError.

    Truncated, or another type: never JSONDecodeError or TypeError.
    """
    _decodes_or_clear_error(index, payload)


# Every annotation the outbox's models carry (outbox._decode_value's docstring), each
# alone and optional.
_HINTS: list[Any] = [str, int, float, bool, JobEventKind, SlotKind, Measurement]
_HINTS += [hint | None for hint in _HINTS]
_EDGES = st.sampled_from(
    [
        *(None, True, False, 0, 1, -1, 2**63, -(2**63), 2**63 - 1, 1.5, 0.0, -0.0, 1e308, 1e309),
        *("", "started", "ended", "mig", "gpu", "nvml", "memory-only", "x", "1"),
        *(float("nan"), float("inf"), -float("inf"), 10**400),
    ]
)


@fuzz(400)
@given(st.sampled_from(range(len(_HINTS))), st.one_of(_EDGES, json_values))
def test_fast_field_decoders_agree_with_the_full_check(index: int, value: Any) -> None:
    """A value the fast path takes decodes to what the full check gives (value and type).

    The collector decodes every row through the fast path (outbox._plan); any value it
    does not take goes to the full check, so only what it takes can differ.
    """
    hint = _HINTS[index]
    fast = outbox._fast_decoder(hint)(value)
    if fast is outbox._SLOW:
        return
    full = outbox._decode_value("fuzz", "field", hint, value)
    assert (type(full), full) == (type(fast), fast) or (full != full and fast != fast)
