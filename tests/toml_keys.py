"""The keys of a slurm-gpu TOML file, for the tests that compare it with the schema.

Shared by test_config.py and test_config_reference.py (a test module imports no other).
"""

from __future__ import annotations

import tomllib
from typing import Any


def leaf_keys(
    table: dict[str, Any], prefix: str = "", values: frozenset[str] = frozenset()
) -> set[str]:
    """Dotted keys of a parsed TOML file.

    `values` are keys whose table is one value (a `dict[str, X]` setting such as
    `partitions = {}`); items of arrays of tables count as `array.key`.
    """
    keys = set()
    for key, value in table.items():
        if isinstance(value, dict) and prefix + key not in values:
            keys |= leaf_keys(value, f"{prefix}{key}.", values)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                keys |= leaf_keys(item, f"{prefix}{key}.", values)
        else:
            keys.add(prefix + key)
    return keys


def commented_examples(text: str) -> dict[str, Any]:
    """The commented-out `# [[name]]` blocks of the example, uncommented and parsed.

    A [[quota]] in the file would change the defaults, so its keys are shown this way.
    A block runs from `# [[name]]` to the first line not starting with "# ".
    """
    lines, inside = [], False
    for line in text.splitlines():
        inside = line.startswith("# [[") or (inside and line.startswith("# "))
        if inside:
            lines.append(line[2:])
    return tomllib.loads("\n".join(lines))
