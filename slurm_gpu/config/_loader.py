"""The generic half of slurm-gpu's configuration: TOML -> validated frozen dataclasses.

Nothing here knows slurm-gpu's keys; the section modules of `slurm_gpu.config` hold the
schema. The loader walks a dataclass's fields and type hints, so a setting is one field
with a default and a `doc(...)` (its one-line reference text and limits).

Supported field types: str, int, float, bool, Path, Duration, Literal[...], list[X] and
tuple[X, ...], dict[str, X], X | None (TOML has no null: None means "not set"), nested
dataclasses (`[section]` / `[section.sub]` tables) and lists of dataclasses (`[[quota]]`
arrays of tables). Errors name the source and the dotted key: `<file>: node.interval: ...`;
array elements are counted from 1, as an admin counts `[[quota]]` blocks.

A key that an earlier release accepted and this one does not is listed in its section's
`REMOVED_KEYS` (key -> what to write instead): an old file that still sets it gets an
error saying where the setting went, never a silent default. A key renamed in this
release is listed in `RENAMED_KEYS` (old -> new): the old name is still read, for one
release, as the new one with a deprecation warning logged (`<file>: <old.key>: ...`);
setting both is an error. The next release moves the old name to `REMOVED_KEYS`.
"""

import dataclasses
import difflib
import json
import logging
import math
import re
import tomllib
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar, Union, get_args, get_origin, get_type_hints

from slurm_gpu.durations import DURATION_FORMS, Duration, format_duration, parse_duration
from slurm_gpu.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")
Check = Callable[[Any], str | None]
"""A field check: gets the converted value, returns what is wrong with it or None."""


def doc(
    text: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    check: Check | None = None,
) -> dict[str, Any]:
    """Metadata for one config key: `field(default=..., metadata=doc("...", above=0))`.

    Args:
        text: one line for the config reference (required for every key).
        minimum: smallest allowed value (inclusive).
        maximum: largest allowed value (inclusive).
        above: the value must be strictly greater than this.
        check: extra validation; gets the converted value, returns an error message or None.
    """
    return {"doc": text, "minimum": minimum, "maximum": maximum, "above": above, "check": check}


def read_toml(file: Path) -> dict[str, Any]:
    """Parse a TOML file, turning every failure into a ConfigError naming the file."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{file}: {exc.strerror or exc}"]) from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{file}: not UTF-8 text: {exc}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{file}: {_toml_error_position(str(exc), data)}"]) from None


def _toml_error_position(message: str, data: bytes) -> str:
    # Python 3.11's TOMLDecodeError carries the position only in its text.
    match = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", message, re.DOTALL)
    if match:
        return f"line {match.group(2)}, column {match.group(3)}: {match.group(1)}"
    match = re.fullmatch(r"(.*) \(at end of document\)", message, re.DOTALL)
    if match:
        lines = data.decode("utf-8", "replace").split("\n")
        return f"line {len(lines)}, column {len(lines[-1]) + 1}: {match.group(1)}"
    return message


class _Invalid(Exception):
    """One value is wrong; the message says what was expected and what was given."""


_FAILED = object()  # a nested table had problems (already recorded)


def parse_settings(schema: type[T], data: Mapping[str, Any], source: str) -> T:
    """Build the dataclass `schema` from parsed TOML, validating everything.

    Args:
        schema: a dataclass whose fields describe the accepted keys.
        data: what tomllib returned.
        source: the file name used in error messages.

    A deprecated key name (a section's `RENAMED_KEYS`) is read as its new name and
    logged as a warning: `<source>: <dotted.old_key>: deprecated; ...`.

    Raises:
        ConfigError: one line per problem: `<source>: <dotted.key>: <what is wrong>`.
    """
    problems: list[tuple[str, str]] = []
    deprecated: list[tuple[str, str]] = []
    result = _convert_table(schema, data, "", problems, deprecated, root=True)
    for key, message in deprecated:
        log.warning("%s: %s: %s", source, key, message)
    if problems:
        raise ConfigError([f"{source}: {key}: {message}" for key, message in problems])
    return result  # type: ignore[no-any-return]


def _convert_table(
    cls: type[Any],
    raw: Mapping[str, Any],
    prefix: str,
    problems: list[tuple[str, str]],
    deprecated: list[tuple[str, str]],
    *,
    root: bool = False,
) -> Any:
    hints = get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    removed: Mapping[str, str] = getattr(cls, "REMOVED_KEYS", {})
    renamed: Mapping[str, str] = getattr(cls, "RENAMED_KEYS", {})
    values: dict[str, Any] = {}
    given: set[str] = set()
    failed = False
    for written, value in raw.items():
        key = prefix + _toml_key(written)
        name = renamed.get(written, written) if written not in known else written
        if name != written:  # a deprecated name: read as the new one; problems name `key`
            new_key = prefix + _toml_key(name)
            if name in raw:
                problems.append(
                    (key, f"the deprecated name of {new_key}, which is set too; remove {written}")
                )
                failed = True
                continue
            until = "the old name is read until the next release"
            deprecated.append((key, f"deprecated; renamed {new_key}: write {name} ({until})"))
        given.add(name)
        if name not in known and name in removed:
            problems.append((key, f"no longer supported; {removed[name]}"))
            failed = True
            continue
        if name not in known:
            what = "unknown section" if root else "unknown key"
            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
            hint = (
                f"did you mean {close[0]!r}?" if close else f"expected one of: {', '.join(known)}"
            )
            problems.append((key, f"{what}; {hint}"))
            failed = True
            continue
        before = len(problems)
        try:
            converted = _convert(hints[name], value, key, problems, deprecated)
            if converted is _FAILED:
                failed = True
                continue
            _check_limits(known[name], converted, value)
        except _Invalid as exc:
            problems.append((key, str(exc)))
        if len(problems) > before:
            failed = True
        else:
            values[name] = converted
    for name, f in known.items():
        if name not in given and _is_required(f):
            problems.append(
                (prefix + _toml_key(name), f"missing required key ({_describe(hints[name])})")
            )
            failed = True
    return _FAILED if failed else cls(**values)


def _is_required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _convert(
    hint: Any,
    raw: Any,
    key: str,
    problems: list[tuple[str, str]],
    deprecated: list[tuple[str, str]],
) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) != 1:
            raise TypeError(f"config fields support only X | None unions, not {hint}")
        return _convert(options[0], raw, key, problems, deprecated)
    if hint is Duration:
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            raise _Invalid(f"expected a duration ({DURATION_FORMS}), got {_show(raw)}")
        try:
            return parse_duration(raw)
        except ValueError as exc:
            raise _Invalid(str(exc)) from None
    if hint is bool:
        return _expect(raw, bool, "a boolean (true or false)")
    if hint is int:
        if isinstance(raw, bool):
            raise _Invalid(f"expected an integer, got {_show(raw)}")
        return _expect(raw, int, "an integer")
    if hint is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise _Invalid(f"expected a number, got {_show(raw)}")
        try:
            number = float(raw)
        except OverflowError:  # an integer beyond a float's range (about 1.8e308)
            raise _Invalid(f"expected a finite number, got {_show(raw)}") from None
        if not math.isfinite(number):
            raise _Invalid(f"expected a finite number, got {_show(raw)}")
        return number
    if hint is str:
        return _expect(raw, str, "a string")
    if hint is Path:
        text = _expect(raw, str, "a path (string)")
        if not text:
            raise _Invalid('expected a path, got "" (empty string)')
        return Path(text)
    if origin is Literal:
        if any(raw == choice and type(raw) is type(choice) for choice in args):
            return raw
        close = [c for c in args if isinstance(raw, str) and str(c).lower() == raw.lower()]
        hint = f"; did you mean {json.dumps(close[0])}?" if close else ""
        raise _Invalid(f"expected one of {_choices(args)}, got {_show(raw)}{hint}")
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(raw, dict):
            raise _Invalid(f"expected a table [{key}], got {_show(raw)}")
        return _convert_table(hint, raw, key + ".", problems, deprecated)
    if origin in (list, tuple):
        item_hint = args[0]
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            raise TypeError(f"config fields support only tuple[X, ...], not {hint}")
        if not isinstance(raw, list):
            raise _Invalid(f"expected an array ({_describe(hint)}), got {_show(raw)}")
        items = [
            _convert_item(item_hint, v, f"{key}[{i}]", problems, deprecated)
            for i, v in enumerate(raw, 1)
        ]
        if any(item is _FAILED for item in items):
            return _FAILED
        return items if origin is list else tuple(items)
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"config tables have string keys, not {hint}")
        if not isinstance(raw, dict):
            raise _Invalid(f"expected a table ({_describe(hint)}), got {_show(raw)}")
        entries = {
            k: _convert_item(args[1], v, f"{key}.{_toml_key(k)}", problems, deprecated)
            for k, v in raw.items()
        }
        if any(item is _FAILED for item in entries.values()):
            return _FAILED
        return entries
    raise TypeError(f"unsupported config field type {hint!r} at {key}")


def _convert_item(
    hint: Any,
    raw: Any,
    key: str,
    problems: list[tuple[str, str]],
    deprecated: list[tuple[str, str]],
) -> Any:
    try:
        return _convert(hint, raw, key, problems, deprecated)
    except _Invalid as exc:
        problems.append((key, str(exc)))
        return _FAILED


def _expect(raw: Any, kind: type[T], expected: str) -> T:
    if not isinstance(raw, kind):
        raise _Invalid(f"expected {expected}, got {_show(raw)}")
    return raw


def _check_limits(f: dataclasses.Field[Any], value: Any, raw: Any) -> None:
    meta = f.metadata
    low, high, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if None not in (low, high) else ""
        bounds = bounds or (f"at least {low}" if low is not None else f"at most {high}")
        raise _Invalid(f"must be {bounds}, got {_show(raw)}")
    if above is not None and value <= above:
        raise _Invalid(f"must be greater than {above}, got {_show(raw)}")
    check = meta.get("check")
    if check is not None and (message := check(value)) is not None:
        raise _Invalid(message)


def _show(raw: Any) -> str:
    """A TOML value as an admin would write it, with its TOML type."""
    if isinstance(raw, bool):
        return f"{str(raw).lower()} (boolean)"
    kind = {int: "integer", float: "float", str: "string", list: "array", dict: "table"}
    name = next((n for t, n in kind.items() if isinstance(raw, t)), type(raw).__name__)
    if isinstance(raw, int) and raw.bit_length() > 200:
        # Too long to show whole, and str() of a huge int can itself fail (the
        # interpreter's 4300-digit limit): show its size instead.
        text = f"{'-' if raw < 0 else ''}~2**{raw.bit_length()}"
    else:
        text = json.dumps(raw, default=str, ensure_ascii=False)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({name})"


def _choices(args: tuple[Any, ...]) -> str:
    return ", ".join(json.dumps(a) for a in args)


# ---------------------------------------------------------------------------- rendering


def render_config(config: object, *, comments: bool = False) -> str:
    """Write a config dataclass (normally `Config`) as TOML that loads back to it.

    Args:
        config: a dataclass instance built from the schema.
        comments: put each key's doc above it as a `#` comment.
    """
    lines: list[str] = []
    _render_table(config, "", lines, comments)
    return "\n".join(lines).strip("\n") + "\n"


def _render_table(obj: Any, prefix: str, lines: list[str], comments: bool) -> None:
    hints = get_type_hints(type(obj))
    nested: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(obj):
        value, hint = getattr(obj, f.name), _unwrap_optional(hints[f.name])
        if value is None:
            continue  # not set; TOML has no null
        if _is_table(hint) or (_table_items(hint) and value):
            nested.append((f.name, value, hint))
            continue
        if comments and f.metadata.get("doc"):
            lines.append(f"# {f.metadata['doc']}")
        lines.append(f"{_toml_key(f.name)} = {_toml_value(value, hint)}")
    for name, value, hint in nested:
        key = prefix + _toml_key(name)
        if _is_table(hint):
            lines += ["", f"[{key}]"]
            _render_table(value, key + ".", lines, comments)
        elif get_origin(hint) is dict:
            for entry_key, entry in value.items():
                lines += ["", f"[{key}.{_toml_key(entry_key)}]"]
                _render_table(entry, f"{key}.{_toml_key(entry_key)}.", lines, comments)
        else:
            for item in value:
                lines += ["", f"[[{key}]]"]
                _render_table(item, key + ".", lines, comments)


def _toml_value(value: Any, hint: Any) -> str:
    hint = _unwrap_optional(hint)
    if hint is Duration:
        return json.dumps(format_duration(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
    args = get_args(hint)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v, args[0] if args else Any) for v in value) + "]"
    if isinstance(value, dict):
        body = ", ".join(f"{_toml_key(k)} = {_toml_value(v, args[1])}" for k, v in value.items())
        return "{ " + body + " }" if body else "{}"
    raise TypeError(f"cannot write {value!r} as TOML")


def _toml_key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name, ensure_ascii=False)


def _unwrap_optional(hint: Any) -> Any:
    if get_origin(hint) in (Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        return options[0] if len(options) == 1 else hint
    return hint


def _is_table(hint: Any) -> bool:
    return dataclasses.is_dataclass(hint) and isinstance(hint, type)


def _table_items(hint: Any) -> bool:
    """A list/tuple/dict whose items are dataclasses: rendered as [[key]] / [key.name]."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (list, tuple):
        return bool(args) and _is_table(args[0])
    if origin is dict:
        return len(args) == 2 and _is_table(args[1])
    return False


# ---------------------------------------------------------------------------- reference


class SettingDoc(NamedTuple):
    """One entry of the config reference.

    Attributes:
        key: dotted key, e.g. "node.interval"; keys inside `[[quota]]` are "quota.account";
            keys inside a table of tables use "<name>": "gpu_cost.<name>.per_hour".
        type: what the value may be, in words ("duration", "array of strings", "table").
        default: the default written as TOML ("" for a table or a required key).
        doc: the field's one-line doc.
    """

    key: str
    type: str
    default: str
    doc: str


def describe_schema(schema: type[Any]) -> Iterator[SettingDoc]:
    """Every section and key of the schema, in file order, for the config reference."""
    yield from _describe_fields(schema, "")


def _describe_fields(cls: type[Any], prefix: str) -> Iterator[SettingDoc]:
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, hint, doc = prefix + f.name, _unwrap_optional(hints[f.name]), f.metadata.get("doc", "")
        if _is_table(hint):
            yield SettingDoc(key, "table", "", doc)
            yield from _describe_fields(hint, key + ".")
        elif _table_items(hint):
            if get_origin(hint) is dict:
                yield SettingDoc(key, "table of tables", "", doc)
                yield from _describe_fields(get_args(hint)[1], key + ".<name>.")
            else:
                yield SettingDoc(key, "array of tables", "", doc)
                yield from _describe_fields(get_args(hint)[0], key + ".")
        else:
            yield SettingDoc(key, _describe(hint), _default_text(f, hint), doc)


def _default_text(f: dataclasses.Field[Any], hint: Any) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return ""
    return "" if value is None else _toml_value(value, hint)


def _describe(hint: Any) -> str:
    hint = _unwrap_optional(hint)
    names = {Duration: "duration", bool: "boolean", int: "integer", float: "number"}
    names |= {str: "string", Path: "path"}
    if hint in names:
        return names[hint]
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return f"one of {_choices(args)}"
    if origin in (list, tuple):
        return f"array of {_plural(_describe(args[0]))}"
    if origin is dict:
        return f"table of {_plural(_describe(args[1]))}"
    if _is_table(hint):
        return "table"
    return str(hint)


def _plural(description: str) -> str:
    return f"({description})" if " " in description else description + "s"
