"""Units every layer shares, and the one test for an unknown figure.

A figure nobody measured is unknown, never 0 (DESIGN.md: missing data is never
"idle"). It reaches the code as None (a model's optional field, a NULL column) or as NaN
(the same value after a pandas or numpy column): `is_known` is the one test for both.
"""

from __future__ import annotations

import math
from typing import TypeGuard, TypeVar

_T = TypeVar("_T")

GIB = float(2**30)
"""Bytes in a GiB (GPU memory is reported in GiB, like nvidia-smi's MiB x 1024)."""


def is_known(value: _T | None) -> TypeGuard[_T]:
    """False for None and NaN (an unknown figure), True for anything else."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))
