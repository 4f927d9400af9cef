"""The layout rules (CONTRIBUTING.md): each outside library has one home in the package.

ruff's banned-api (TID251, pyproject.toml) flags an import outside the homes, but it is one
code for every ban, so a home's exception opens it to all of them. These tests keep the rule
exact, and prove that each exception in pyproject.toml is needed (removing it fails ruff).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slurm_gpu"

# library -> the paths (relative to the repository) where it may be imported.
HOMES: dict[str, tuple[str, ...]] = {
    "pynvml": ("slurm_gpu/gpu/",),
    # Slurm's commands; and the collector starting its own worker processes.
    "subprocess": ("slurm_gpu/slurm/runner.py", "slurm_gpu/collector/processes.py"),
    "sqlalchemy": ("slurm_gpu/store/",),
    "alembic": ("slurm_gpu/store/",),
    "pandas": ("slurm_gpu/reports/",),
    # The store's bulk reads fill numpy arrays straight from the cursor.
    "numpy": ("slurm_gpu/reports/", "slurm_gpu/ledger/", "slurm_gpu/store/queries.py"),
    "slurm_gpu.cli": ("slurm_gpu/cli/",),
}


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file imports, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
    return found


def uses(module: str, library: str) -> bool:
    """Whether `module` is `library` or inside it."""
    return module == library or module.startswith(library + ".")


def test_each_library_is_imported_only_in_its_home() -> None:
    """No module of the package imports a library outside that library's home."""
    strays = sorted(
        f"{path.relative_to(ROOT)} imports {library}"
        for path in PACKAGE.rglob("*.py")
        for module in imported_modules(path)
        for library, homes in HOMES.items()
        if uses(module, library) and not str(path.relative_to(ROOT)).startswith(homes)
    )
    assert [] == strays


def test_the_rule_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The import reader finds absolute, dotted and relative imports (resolved)."""
    source = tmp_path / "slurm_gpu" / "cli" / "probe.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "import numpy as np\nfrom sqlalchemy.orm import Session\nfrom .context import App\n"
        "from . import params\n"
    )
    expected = {"numpy", "sqlalchemy.orm", "slurm_gpu.cli.context", "slurm_gpu.cli"}
    assert expected == imported_modules(source, tmp_path)


def package_exceptions() -> dict[str, list[str]]:
    """pyproject.toml's per-file-ignores that open a home of the package to TID251."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ignores: dict[str, list[str]] = config["tool"]["ruff"]["lint"]["per-file-ignores"]
    return {
        pattern: codes
        for pattern, codes in ignores.items()
        if pattern.startswith("slurm_gpu/") and "TID251" in codes
    }


@pytest.mark.parametrize("home", sorted(package_exceptions()))
def test_removing_a_home_exception_makes_ruff_fail(home: str) -> None:
    """Each banned-api exception is needed: without it ruff reports the home's imports."""
    kept = {pattern: codes for pattern, codes in package_exceptions().items() if pattern != home}
    table = ", ".join(
        f'"{pattern}" = {codes!r}'.replace("'", '"') for pattern, codes in kept.items()
    )
    ruff = Path(sys.executable).with_name("ruff")
    result = subprocess.run(
        [
            str(ruff),
            "check",
            "--no-cache",
            "--select",
            "TID251",
            "--config",
            f"lint.per-file-ignores = {{{table}}}",
            "slurm_gpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert 1 == result.returncode, result.stdout + result.stderr
    assert "TID251" in result.stdout
