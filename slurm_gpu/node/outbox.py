"""The outbox codec: how the spool's rows are encoded for shipping, and decoded back.

Each outbox row is a kind, an idempotency key and a JSON payload. The payload of an
`interval`, `event`, `summary` or `activity` row is its model's fields (`asdict`), an
`inventory` row is `{"devices": [GpuDevice fields...], "seen_at": seconds}`, from the agent
also with `"lost": [LostGpu fields...]` (the GPUs it cannot read; absent: not reported).
A device's MIG fields are there only for a GPU in MIG mode (`device_fields`), its MIG
devices as objects of MigDevice's fields. A `physical` row is a GpuPhysicalInterval's
fields (issue 14), a `heartbeat` row a NodeHeartbeat's (issue 16: one a tick, replaced).

The outbox is written by this program, but it is a file on a node's disk that outlives
upgrades and can be damaged: a payload is checked field by field on the way out, so a
bad row is an OutboxError naming the row kind and field, never a TypeError deep in the
store.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from typing import Any, TypeVar

from slurm_gpu.errors import SlurmGpuError, brief
from slurm_gpu.models import (
    GpuActivity,
    GpuDevice,
    GpuInterval,
    GpuPhysicalInterval,
    JobEvent,
    JobGpuSummary,
    LostGpu,
    MigDevice,
    NodeHeartbeat,
)

_M = TypeVar("_M")
_INT_RANGE = 2**63  # the store's BIGINT


class OutboxError(SlurmGpuError):
    """An outbox row does not decode into its model (a damaged payload, an unknown kind)."""


def encode(payload: Any) -> str:
    """A JSON-able payload (a model's `asdict`, plain dicts and lists) as outbox JSON.

    Raises:
        TypeError: the payload holds a value JSON cannot carry.
    """
    return json.dumps(payload, default=_jsonable)


def fields_of(model: Any) -> dict[str, Any]:
    """A flat model's fields as `dataclasses.asdict` gives them, without its deep copy.

    The models the outbox carries hold only numbers, strings, enums and tuples of them;
    asdict's recursive copy cost the agent more than NVML for an interval (bench/agent).
    """
    fields = dict(vars(model))
    for name, default in _WHOLE_GPU.items():
        if name in fields and fields[name] == default:
            del fields[name]
    return fields


# A model's GPU slot fields (issue 14) at their whole-GPU defaults are left out: a whole
# GPU's row is the row shipped before slots, byte for byte; decoding gives the defaults.
_WHOLE_GPU: dict[str, Any] = {
    "slot_id": "",
    "slot_kind": "gpu",
    "share": 1.0,
    "mig_profile": "",
    "measured_by": "nvml",
}


def device_fields(device: GpuDevice) -> dict[str, Any]:
    """A GpuDevice's inventory fields: its MIG fields only for a GPU in MIG mode.

    A GPU not in MIG mode gives the fields an agent before MIG shipped, byte for byte.
    """
    fields = dict(vars(device))
    if not device.mig_enabled and not device.mig_devices:
        del fields["mig_enabled"], fields["mig_devices"]
    else:
        fields["mig_devices"] = [dict(vars(mig)) for mig in device.mig_devices]
    return fields


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # JobEventKind, SlotKind, Measurement
        return value.value
    raise TypeError(f"cannot serialise {type(value).__name__}")


def decode_interval(payload: str) -> GpuInterval:
    """An outbox `interval` payload back into its model. Raises OutboxError."""
    return _decode_model("interval", GpuInterval, _load("interval", payload))


def decode_event(payload: str) -> JobEvent:
    """An outbox `event` payload back into its model. Raises OutboxError."""
    return _decode_model("event", JobEvent, _load("event", payload))


def decode_summary(payload: str) -> JobGpuSummary:
    """An outbox `summary` payload back into its model. Raises OutboxError."""
    return _decode_model("summary", JobGpuSummary, _load("summary", payload))


def decode_activity(payload: str) -> GpuActivity:
    """An outbox `activity` payload back into its model. Raises OutboxError."""
    return _decode_model("activity", GpuActivity, _load("activity", payload))


def decode_physical(payload: str) -> GpuPhysicalInterval:
    """An outbox `physical` payload back into its model. Raises OutboxError."""
    return _decode_model("physical", GpuPhysicalInterval, _load("physical", payload))


def decode_heartbeat(payload: str) -> NodeHeartbeat:
    """An outbox `heartbeat` payload back into its model. Raises OutboxError."""
    return _decode_model("heartbeat", NodeHeartbeat, _load("heartbeat", payload))


def decode_inventory(payload: str) -> tuple[list[GpuDevice], float, list[LostGpu] | None]:
    """An outbox `inventory` payload: (devices, seen_at, lost). Raises OutboxError.

    `lost` is None when the row does not say (the agent's first row, an older agent's).
    """
    data = _load("inventory", payload)
    if not isinstance(data, dict) or set(data) not in (
        {"devices", "seen_at"},
        {"devices", "seen_at", "lost"},
    ):
        raise OutboxError(
            f"outbox inventory row: expected an object with devices and seen_at, got {_brief(data)}"
        )
    devices = data["devices"]
    if not isinstance(devices, list):
        raise OutboxError(f"outbox inventory row: devices: expected a list, got {_brief(devices)}")
    seen_at = _decode_value("inventory", "seen_at", float, data["seen_at"])
    assert isinstance(seen_at, float)
    lost = data.get("lost")
    if lost is not None and not isinstance(lost, list):
        raise OutboxError(f"outbox inventory row: lost: expected a list, got {_brief(lost)}")
    return (
        [_decode_model("inventory", GpuDevice, d) for d in devices],
        seen_at,
        None if lost is None else [_decode_model("inventory", LostGpu, g) for g in lost],
    )


def _load(kind: str, payload: str) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, too-long integers
        raise OutboxError(f"outbox {kind} row: payload is not JSON ({exc})") from None


def _decode_model(kind: str, model: type[_M], data: Any) -> _M:
    if not isinstance(data, dict):
        raise OutboxError(f"outbox {kind} row: expected a JSON object, got {_brief(data)}")
    plan = _plan(model)
    if not data.keys() <= plan.names:
        unknown = sorted(str(name) for name in data if name not in plan.names)
        raise OutboxError(f"outbox {kind} row: unknown field {_brief(unknown[0])}")
    values: dict[str, Any] = {}
    for name, hint, fast, required in plan.fields:
        if name in data:
            value = fast(data[name])
            if value is _SLOW:  # not the common shape: the full check, or its error
                value = _decode_value(kind, name, hint, data[name])
            values[name] = value
        elif required:
            raise OutboxError(f"outbox {kind} row: field {name} is missing")
    return model(**values)


class _Plan(typing.NamedTuple):
    """How one model's payload decodes: its field names, and per field a fast check."""

    names: frozenset[str]
    # (name, annotation, fast decoder, required) in the dataclass's field order, so
    # that the first bad field named is the same whatever the payload's key order.
    fields: tuple[tuple[str, Any, typing.Callable[[Any], Any], bool], ...]


_PLANS: dict[type[Any], _Plan] = {}
_SLOW = object()  # a fast decoder's "not mine": _decode_value decides


def _plan(model: type[Any]) -> _Plan:
    """The model's decoding plan, made once: the collector decodes every row it takes."""
    plan = _PLANS.get(model)
    if plan is None:
        hints = typing.get_type_hints(model)
        fields = tuple(
            (
                f.name,
                hints[f.name],
                _fast_decoder(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(model)
            if f.init
        )
        plan = _PLANS[model] = _Plan(frozenset(f[0] for f in fields), fields)
    return plan


def _fast_decoder(hint: Any) -> typing.Callable[[Any], Any]:
    """A decoder for the common, valid values of `hint`, else `_SLOW`.

    What it returns equals what `_decode_value` returns for the same value; anything
    else (an integer where a float is due, a tuple, a bad value) goes to `_decode_value`.
    """
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        decode = _fast_decoder(inner)
        return lambda value: None if value is None else decode(value)
    if hint is str:
        return lambda value: value if type(value) is str else _SLOW
    if hint is bool:
        return lambda value: value if value is True or value is False else _SLOW
    if hint is int:
        return lambda value: (
            value if type(value) is int and -_INT_RANGE < value < _INT_RANGE else _SLOW
        )
    if hint is float:
        return lambda value: value if type(value) is float and math.isfinite(value) else _SLOW
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        members = {str(member.value): member for member in hint}
        return lambda value: members.get(value, _SLOW) if type(value) is str else _SLOW
    return lambda value: _SLOW


def _decode_value(kind: str, name: str, hint: Any, value: Any) -> Any:
    """One field, checked against its annotation.

    The annotations the models use: str, int, float, bool, the enum, X | None,
    tuple[int, ...], tuple[str, ...] (NodeHeartbeat.slots).
    """
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        what = _EXPECTED.get(hint, "a value") + " or null"
    else:
        what = _EXPECTED.get(hint) or _LISTS.get(hint, "a list")
    if hint is str and isinstance(value, str):
        return value
    if hint is bool and isinstance(value, bool):  # GpuDevice.gpm_supported
        return value
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int and number and isinstance(value, int) and -_INT_RANGE < value < _INT_RANGE:
        return value
    if hint is float and number:
        try:
            result = float(value)
        except OverflowError:  # an integer beyond a float's range
            result = math.inf
        if math.isfinite(result):
            return result
    if isinstance(hint, type) and issubclass(hint, enum.Enum) and value in _values_of(hint):
        return hint(value)
    if typing.get_origin(hint) is tuple and isinstance(value, list):
        (element, *_) = typing.get_args(hint)
        if element is MigDevice:  # GpuDevice.mig_devices
            return tuple(_decode_model(kind, MigDevice, v) for v in value)
        return tuple(_decode_value(kind, f"{name}[{i}]", element, v) for i, v in enumerate(value))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        what = "one of " + ", ".join(_values_of(hint))
    raise OutboxError(f"outbox {kind} row: field {name}: expected {what}, got {_brief(value)}")


def _values_of(kind: type[enum.Enum]) -> list[str]:
    """The values an enum field may carry (JobEventKind, SlotKind, Measurement)."""
    return [str(k.value) for k in kind]


_EXPECTED = {str: "a string", int: "an integer", float: "a finite number", bool: "true or false"}
_LISTS = {tuple[int, ...]: "a list of integers", tuple[str, ...]: "a list of strings"}


def _brief(value: Any) -> str:
    """A payload value as JSON, for a problem line (errors.brief)."""
    return brief(value, 60, lambda v: json.dumps(v, default=str))
