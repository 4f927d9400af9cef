"""Slurm hostlist expressions (slurm/hostlist.py), as `scontrol show hostnames` expands them."""

from __future__ import annotations

import pytest

from slurm_gpu.errors import SlurmError
from slurm_gpu.slurm.hostlist import MAX_NAMES, expand


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu1", ["gpu1"]),
        ("gpu[1-3,7]", ["gpu1", "gpu2", "gpu3", "gpu7"]),
        ("n[01-03]", ["n01", "n02", "n03"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("/dev/nvidia[0-1]", ["/dev/nvidia0", "/dev/nvidia1"]),
    ],
)
def test_expand(text: str, expected: list[str]) -> None:
    """Ranges, lists, zero padding, several brackets, device files."""
    assert expected == expand(text)


@pytest.mark.parametrize("text", ["n[²]", "gpu[²1-2]", "n[3-1]", "n[]", "n[1-]", "n[[1]]", "n[1"])
def test_malformed_ranges_are_slurm_errors(text: str) -> None:
    """Non-ASCII digits, reversed, empty, nested or unbalanced ranges: SlurmError."""
    with pytest.raises(SlurmError):
        expand(text)


def test_total_expansion_is_bounded() -> None:
    """Nested ranges multiply: n[0-999][0-999] is refused, not a million names."""
    with pytest.raises(SlurmError, match=f"more than {MAX_NAMES} names"):
        expand("n[0-999][0-999]")


def test_the_bound_counts_every_item_of_the_list() -> None:
    """The limit is on the whole expression, not on each comma-separated item."""
    assert MAX_NAMES == len(expand(f"n[1-{MAX_NAMES}]"))
    with pytest.raises(SlurmError):
        expand(f"n[1-{MAX_NAMES}],m1")
