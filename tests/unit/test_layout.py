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
from collections.abc import Collection, Iterator, Mapping
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


def imported_modules(
    path: Path,
    root: Path = ROOT,
    *,
    module_level: bool = False,
    modules: Collection[str] = (),
) -> set[str]:
    """Every module a file imports, relative imports resolved against its package.

    Args:
        path: the file.
        root: the directory its dotted names start from.
        module_level: only what importing the module runs: its top level and the blocks
            of top-level `if` and `try` (`if TYPE_CHECKING:` included), not the imports
            inside functions.
        modules: dotted names of known modules: `from package import name` gives
            `package.name` where that is one of them (a submodule), else `package`.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in top_level_statements(tree.body) if module_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.update(
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                for alias in node.names
            )
    return found


def top_level_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run when a module is imported: its body, into `if` and `try` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from top_level_statements(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            handlers = [s for handler in node.handlers for s in handler.body]
            yield from top_level_statements(node.body + handlers + node.orelse + node.finalbody)


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


# ---------------------------------------------------------------------------- import graph


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of a module file (a package's `__init__.py`: the package's)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(package: Path = PACKAGE, root: Path = ROOT) -> dict[str, Path]:
    """{dotted name: file} of every module of the package."""
    return {module_name(path, root): path for path in sorted(package.rglob("*.py"))}


def import_graph(modules: Mapping[str, Path], root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the package's modules it imports when imported}.

    Module-level imports only, `if TYPE_CHECKING:` ones included (the circles of issue 24
    ran through them); a function's imports run later, when nothing is half-imported.
    A package's `__init__` is an edge only where it is imported by name (`from slurm_gpu.store
    import Store`), not for every module inside it.
    """
    return {
        name: {
            imported
            for imported in imported_modules(path, root, module_level=True, modules=modules)
            if imported in modules and imported != name
        }
        for name, path in modules.items()
    }


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The import circles: each group of modules that import one another, directly or not."""

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo += graph[node]
        return seen

    reach = {name: reachable(name) for name in graph}
    groups = {
        tuple(sorted({name} | {other for other in reach[name] if name in reach[other]}))
        for name in graph
        if name in reach[name]
    }
    return sorted(list(group) for group in groups)


def test_no_module_of_the_package_is_in_an_import_circle() -> None:
    """No two modules of slurm_gpu import each other, directly or through others."""
    assert [] == cycles(import_graph(package_modules()))


def test_the_circle_finder_sees_type_checking_and_ignores_function_imports(
    tmp_path: Path,
) -> None:
    """A circle through `if TYPE_CHECKING:` counts; one closed by a function's import does not."""
    package = tmp_path / "slurm_gpu"
    package.mkdir()
    files = {
        "__init__.py": "from slurm_gpu.a import A\n",
        "a.py": "from slurm_gpu import b\nA = 1\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n",
        "c.py": "from slurm_gpu import a\n",
        "d.py": "import slurm_gpu.c\ndef late() -> None:\n    from slurm_gpu import d\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    graph = import_graph(package_modules(package, tmp_path), tmp_path)
    assert [["slurm_gpu.a", "slurm_gpu.b"]] == cycles(graph)
    assert {"slurm_gpu.c"} == graph["slurm_gpu.d"]


# ------------------------------------------------------------------ the store's raw tables

# The modules outside slurm_gpu/store/ that import the store's raw tables (store/schema.py)
# today (issue 24: the reports read through the store's queries, never its tables). This
# list only shrinks: a module not on it that imports schema fails the test.
SCHEMA_IMPORTERS_TODAY = frozenset(
    {
        # Both read the rollup tables' column names (USAGE_SUMS, USAGE_PLACE, ...).
        "slurm_gpu/reports/grouped.py",
        "slurm_gpu/reports/rollups.py",
    }
)


def test_no_new_module_outside_the_store_imports_its_raw_tables() -> None:
    """slurm_gpu.store.schema is imported only inside slurm_gpu/store/ (and by today's list)."""
    modules = package_modules()
    strays = sorted(
        str(path.relative_to(ROOT))
        for path in modules.values()
        if not str(path.relative_to(ROOT)).startswith("slurm_gpu/store/")
        and any(uses(m, "slurm_gpu.store.schema") for m in imported_modules(path, modules=modules))
    )
    assert [] == [stray for stray in strays if stray not in SCHEMA_IMPORTERS_TODAY]


# ---------------------------------------------------------------------------- the ledger

LEDGER = PACKAGE / "ledger"
# What the ledger's rules may import besides the standard library and itself (issue 24:
# one pure package, no pandas, no SQLAlchemy, no I/O): the shared models, the units and the
# settings; and numpy, whose arrays its rules take (its TID251 exception in pyproject.toml).
LEDGER_MAY_IMPORT = (
    "slurm_gpu.ledger",
    "slurm_gpu.models",
    "slurm_gpu.units",
    "slurm_gpu.config",
    "numpy",
)
# The layers above the ledger: none of them may be imported by it, directly or not.
ABOVE_THE_LEDGER = (
    "slurm_gpu.reports",
    "slurm_gpu.store",
    "slurm_gpu.policy",
    "slurm_gpu.cli",
    "slurm_gpu.node",
    "slurm_gpu.metrics",
    "slurm_gpu.app",
)
needs_the_ledger = pytest.mark.skipif(not LEDGER.is_dir(), reason="no slurm_gpu/ledger/ yet")


@needs_the_ledger
def test_the_ledger_imports_only_models_units_config_and_the_standard_library() -> None:
    """Every import in slurm_gpu/ledger/ is the standard library, itself or LEDGER_MAY_IMPORT."""
    modules = package_modules()
    strays = sorted(
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted(LEDGER.rglob("*.py"))
        for module in imported_modules(path, modules=modules)
        if module.split(".")[0] not in sys.stdlib_module_names
        and not any(uses(module, allowed) for allowed in LEDGER_MAY_IMPORT)
    )
    assert [] == strays


@needs_the_ledger
def test_nothing_the_ledger_imports_reaches_a_layer_above_it() -> None:
    """No module the ledger imports, directly or through others, is in reports, store, ...

    Every import counts here (a function's too), and so does each module's package: Python
    runs `slurm_gpu/config/__init__.py` before `slurm_gpu.config.reports`.
    """
    modules = package_modules()
    imports = {
        name: {m for m in imported_modules(path, modules=modules) if m in modules}
        for name, path in modules.items()
    }
    seen: set[str] = set()
    todo = [name for name in modules if uses(name, "slurm_gpu.ledger")]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            parents = {name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)}
            todo += imports[name] | (parents & modules.keys())
    assert [] == sorted(m for m in seen if any(uses(m, above) for above in ABOVE_THE_LEDGER))
