"""The package's layers (docs/architecture.md, "The layers"): every module of ldpfed imports only from its own folder
and from lower floors, so there is no import circle; nothing of the runtime imports ldpfed.ops. Read from the
source (every import statement, at the top or inside a function), nothing is imported."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ldpfed"

# The floor of each folder or top-level module: an import must go to a lower floor or stay in its own folder.
FLOORS = {
    "util": 0,
    "plugins": 1,
    "mechanisms": 2, "envs": 2,
    "federation": 2.25, "trust": 2.5,
    "algorithms": 3,
    "config": 4, "engine": 4, "tracking": 4,
    "sweep_spec": 5, "reproduce": 5, "stress": 5, "testing": 5, "server_audit": 5,
    "sweep_runner": 6, "ops": 6,
    "cli": 7,
    "__main__": 8,
}
# ops starts clusters and signals processes: only the command line may use it (and then inside the command).
OPS_USERS = {"cli", "__main__"}


def unit_of(path: Path) -> str | None:
    """The folder or top-level module a source file belongs to (None: the package's own __init__)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return None if parts == ("__init__",) else parts[0]


def imported(path: Path):
    """(line, dotted module) of every ldpfed module that `path` imports, relative imports resolved."""
    package = ["ldpfed", *path.relative_to(PACKAGE).parent.parts]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:      # `from ldpfed import sweep_spec` imports the module ldpfed.sweep_spec
                yield node.lineno, f"{base}.{alias.name}" if base == "ldpfed" else base


def target_unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "ldpfed" or len(parts) < 2:
        return None
    return parts[1]


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_folder_has_a_floor():
    units = {unit_of(p) for p in SOURCES} - {None}
    assert units <= set(FLOORS), f"give these a floor: {sorted(units - set(FLOORS))}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_only_go_down(path):
    unit = unit_of(path)
    if unit is None:
        return
    upward = []
    for line, module in imported(path):
        target = target_unit(module)
        if target is None or target == unit or target not in FLOORS:
            continue
        if FLOORS[target] >= FLOORS[unit]:
            upward.append(f"line {line}: {module} (floor {FLOORS[target]}, this is {unit} on floor {FLOORS[unit]})")
        if target == "ops" and unit not in OPS_USERS:
            upward.append(f"line {line}: {module} (ops is for the command line and jobs only)")
    assert not upward, "\n".join(upward)
