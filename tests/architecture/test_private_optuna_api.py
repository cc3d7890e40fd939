"""Optuna's private API is reached only through ``optuna_quant/_optuna_private.py``.

Read from the package's syntax trees, every module but that one:

- no ``X._name`` (nor ``getattr(X, "_name")``) where ``_name`` is no name of optuna_quant's own:
  it can then only be another package's private attribute. ``self`` and ``cls`` are always the
  package's own;
- no import of an Optuna module or name with a ``_``-prefixed part (``optuna.storages._rdb``);
- system attributes read or written under optuna_quant's own keys only (``optuna_quant:...``):
  the others are Optuna's internal records (``fixed_params``, the constraints), whose keys and
  format are no public contract.

The rule reads names, not types: a private attribute of another package than Optuna fails it too,
which is as well.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[2] / "optuna_quant"
GATEWAY = PACKAGE / "_optuna_private.py"
OWN_KEY_PREFIX = "optuna_quant:"
_ATTRIBUTE_BUILTINS = {"getattr", "hasattr", "setattr", "delattr"}
_SYSTEM_ATTR_SETTERS = {"set_system_attr", "set_trial_system_attr"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _own_names(trees: dict[Path, ast.Module]) -> set[str]:
    """The private names that optuna_quant defines: its modules, functions, classes, the names it
    assigns, and the attributes it sets on ``self`` or ``cls``. Imported names are not its own."""
    names = {part for path in trees for part in path.relative_to(PACKAGE.parent).with_suffix("").parts}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
                names.add(node.attr)
    return {name for name in names if _is_private(name)}


def _string_constants(trees: dict[Path, ast.Module]) -> dict[str, str | None]:
    """The package's module-level string constants by name (``None`` where two modules differ)."""
    constants: dict[str, str | None] = {}
    for tree in trees.values():
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        seen = constants.setdefault(target.id, node.value.value)
                        if seen != node.value.value:
                            constants[target.id] = None
    return constants


def _private_attributes(tree: ast.Module, own: set[str]) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if _is_private(node.attr) and node.attr not in own and not _is_self(node.value):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ATTRIBUTE_BUILTINS:
            name = node.args[1] if len(node.args) > 1 else None
            if (
                isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and _is_private(name.value)
                and name.value not in own
                and not _is_self(node.args[0])
            ):
                yield node.lineno, ast.unparse(node)


def _private_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "optuna" and any(_is_private(part) for part in parts):
                yield node.lineno, ast.unparse(node)


def _foreign_system_attrs(tree: ast.Module, constants: dict[str, str | None]) -> Iterator[tuple[int, str]]:
    """Uses of system attributes other than a read or write under one of the package's own keys."""

    def own_key(node: ast.expr | None) -> bool:
        if isinstance(node, ast.Constant):
            value = node.value
        elif isinstance(node, ast.Name):
            value = constants.get(node.id)
        elif isinstance(node, ast.Attribute):
            value = constants.get(node.attr)
        else:
            return False
        return isinstance(value, str) and value.startswith(OWN_KEY_PREFIX)

    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "system_attrs":
            use: ast.AST = parent[node]
            if isinstance(use, ast.Subscript) and use.value is node:
                allowed = own_key(use.slice)
            elif isinstance(use, ast.Compare) and isinstance(use.ops[0], (ast.In, ast.NotIn)):
                allowed = use.comparators[0] is node and own_key(use.left)
            elif isinstance(use, ast.Attribute) and use.attr == "get" and isinstance(parent[use], ast.Call):
                use = parent[use]
                allowed = bool(use.args) and own_key(use.args[0])
            else:
                allowed = False
            if not allowed:
                yield node.lineno, ast.unparse(use if isinstance(use, (ast.expr, ast.keyword)) else node)
        elif isinstance(node, ast.keyword) and node.arg == "system_attrs":
            value = node.value
            if isinstance(value, ast.Attribute) and value.attr == "system_attrs":
                continue  # reported as that use of system_attrs
            if not (isinstance(value, ast.Dict) and all(own_key(key) for key in value.keys)):
                yield value.lineno, f"system_attrs={ast.unparse(value)}"
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            # The key stands before the value, last: (trial_id, key, value) or (key, value).
            if name in _SYSTEM_ATTR_SETTERS and not (len(node.args) >= 2 and own_key(node.args[-2])):
                yield node.lineno, ast.unparse(node)


def test_only_the_gateway_reaches_into_optuna_private_api() -> None:
    trees = _trees()
    own = _own_names(trees)
    constants = _string_constants(trees)
    found = []
    for path, tree in trees.items():
        if path == GATEWAY:
            continue
        uses = [*_private_attributes(tree, own), *_private_imports(tree), *_foreign_system_attrs(tree, constants)]
        found += [f"{path.relative_to(PACKAGE.parent)}:{line}: {code}" for line, code in sorted(uses)]
    assert not found, (
        "Optuna's private API outside optuna_quant/_optuna_private.py (move each use there, with its "
        "reason):\n" + "\n".join(found)
    )


def test_the_rule_sees_each_kind_of_private_use() -> None:
    code = """
import optuna.storages._rdb.models
from optuna.study._optimize import _optimize
study._storage.get_all_trials(study._study_id)
getattr(storage, "_backend", storage)
trial.system_attrs.get("fixed_params")
optuna.trial.create_trial(system_attrs=t.system_attrs)
self._own
trial.system_attrs.get(CLAIM_KEY)
"""
    tree = ast.parse(code)
    constants = {"CLAIM_KEY": "optuna_quant:claim"}
    uses = [
        *_private_attributes(tree, own={"_own"}),
        *_private_imports(tree),
        *_foreign_system_attrs(tree, constants),
    ]
    assert sorted(line for line, _ in uses) == [2, 3, 4, 4, 5, 6, 7]
