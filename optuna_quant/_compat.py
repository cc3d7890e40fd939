"""The import paths of optuna-quant 0.1's flat layout, kept for one release.

``import optuna_quant.objective`` and ``from optuna_quant.storage import open_storage`` still work:
each old module name is an alias of the module that now holds its names, with a
``DeprecationWarning`` that names the new path.
"""

from __future__ import annotations

from collections.abc import Sequence
import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
import warnings


MOVED = {
    "optuna_quant.artifacts": "optuna_quant.storages.artifacts",
    "optuna_quant.config": "optuna_quant.cli.config",
    "optuna_quant.dashboard": "optuna_quant.visualization.dashboard",
    "optuna_quant.evaluate": "optuna_quant.measure.evaluate",
    "optuna_quant.figures": "optuna_quant.visualization.figures",
    "optuna_quant.latency": "optuna_quant.measure.latency",
    "optuna_quant.loss": "optuna_quant.measure.loss",
    "optuna_quant.model_io": "optuna_quant.quantization.model_io",
    "optuna_quant.objective": "optuna_quant.trial.objective",
    "optuna_quant.prepare": "optuna_quant.quantization.prepare",
    "optuna_quant.probe": "optuna_quant.cli.probe",
    "optuna_quant.quantize": "optuna_quant.quantization.quantize",
    "optuna_quant.records": "optuna_quant.trial.records",
    "optuna_quant.report": "optuna_quant.visualization.report",
    "optuna_quant.results": "optuna_quant.trial.results",
    "optuna_quant.samplers.bayesian": "optuna_quant.samplers._gp",
    "optuna_quant.samplers.gp": "optuna_quant.samplers._gp",
    "optuna_quant.samplers.tpe": "optuna_quant.samplers._tpe.sampler",
    "optuna_quant.sensitivity": "optuna_quant.measure.sensitivity",
    "optuna_quant.space": "optuna_quant.trial.space",
    "optuna_quant.storage": "optuna_quant.storages",
    "optuna_quant.torch_export": "optuna_quant.quantization.torch_export",
    "optuna_quant.worker": "optuna_quant.study.worker",
}
"""Each old module and the module that took its place."""


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} is deprecated; import {self.new}", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: ModuleType) -> None:
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Make the old module names importable (once per process)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
