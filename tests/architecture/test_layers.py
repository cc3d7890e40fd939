"""The package's layers: lower ones never import upper ones, and there is no import cycle.

``docs/architecture.md`` draws the layers. Every import of an ``optuna_quant`` module counts,
in a function or under ``TYPE_CHECKING`` too: such an import still ties the two layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest


PACKAGE = Path(__file__).resolve().parents[2] / "optuna_quant"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("logs", "_optuna_private", "_compat"),
    ("quantization",),
    ("measure",),
    ("samplers", "storages"),
    ("trial",),
    ("visualization", "pruners"),
    ("study",),
    ("cli",),
)
"""Bottom first; a module may import its own layer's and the lower layers' modules."""
STANDALONE = {
    "samplers": {"samplers", "_optuna_private"},
    "storages": {"storages", "_optuna_private"},
}
"""Parts that import nothing of the package but these: plain Optuna samplers and storages."""
FREE_OF_OPTUNA = ("quantization", "measure")
FREE_OF_ONNXRUNTIME = ("visualization",)
"""Parts that read a stored study: no onnxruntime, even through the modules they import."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """The package modules and the top-level outside packages that ``path`` imports."""
    tree = ast.parse(path.read_text())
    inside: set[str] = set()
    outside: set[str] = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # ``from package import module`` imports that module; ``from module import name``, the module.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in _MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            (inside if name.startswith("optuna_quant") else outside).add(name)
    return {name for name in inside if name in _MODULES}, {name.split(".")[0] for name in outside}


_MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
_LAYER_OF = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def _graph() -> dict[str, set[str]]:
    return {module: _imports(path)[0] - {module} for module, path in _MODULES.items()}


def _checked_modules() -> list[str]:
    # The package's own __init__ loads its names lazily; qat and testing stand beside the layers.
    return sorted(m for m in _MODULES if _part(m) in _LAYER_OF)


@pytest.mark.parametrize("module", _checked_modules())
def test_a_module_imports_only_its_own_layer_and_lower_ones(module: str) -> None:
    part = _part(module)
    assert part is not None
    upward = sorted(
        imported
        for imported in _graph()[module]
        if _part(imported) in _LAYER_OF and _LAYER_OF[_part(imported)] > _LAYER_OF[part]  # type: ignore[index]
    )
    assert not upward, f"{module} (layer {part}) imports upper layers: {upward}"
    allowed = STANDALONE.get(part)
    if allowed is not None:
        foreign = sorted(imported for imported in _graph()[module] if _part(imported) not in allowed)
        assert not foreign, f"{module} must stand alone ({sorted(allowed)}) but imports {foreign}"


@pytest.mark.parametrize("module", sorted(m for m in _MODULES if _part(m) in FREE_OF_OPTUNA))
def test_the_model_layers_do_not_import_optuna(module: str) -> None:
    assert "optuna" not in _imports(_MODULES[module])[1], f"{module} imports optuna"


def test_the_package_has_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                cycle = stack[stack.index(imported):] + [imported]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if imported not in state:
                visit(imported)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_reading_a_study_loads_no_onnxruntime() -> None:
    import subprocess
    import sys

    modules = [m for m in _MODULES if _part(m) in FREE_OF_ONNXRUNTIME] + ["optuna_quant.trial.records"]
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + "print('onnxruntime' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", f"{modules} load onnxruntime"
