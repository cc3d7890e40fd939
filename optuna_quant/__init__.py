"""optuna-quant: tune post-training int8 quantization of ONNX and PyTorch models with Optuna.

The names below load on first use, so that reading a stored study (``optuna_quant.visualization``)
loads no onnxruntime; ``docs/architecture.md`` shows the package's layers.
"""

from __future__ import annotations

import importlib
from typing import Any
from typing import TYPE_CHECKING

from optuna_quant import _compat


if TYPE_CHECKING:
    from optuna_quant.measure.evaluate import Top1Accuracy
    from optuna_quant.measure.latency import BenchmarkSettings
    from optuna_quant.measure.loss import Targets
    from optuna_quant.quantization.config import QuantConfig
    from optuna_quant.samplers import DiscreteGPSampler
    from optuna_quant.samplers import TPESampler
    from optuna_quant.study import create_study
    from optuna_quant.study import QuantStudy
    from optuna_quant.trial.guidance import prior_for_space
    from optuna_quant.trial.objective import QuantizationObjective
    from optuna_quant.trial.results import BestResult
    from optuna_quant.trial.space import SearchSpace

_EXPORTS = {
    "BenchmarkSettings": "optuna_quant.measure.latency",
    "BestResult": "optuna_quant.trial.results",
    "DiscreteGPSampler": "optuna_quant.samplers",
    "QuantConfig": "optuna_quant.quantization.config",
    "QuantStudy": "optuna_quant.study",
    "QuantizationObjective": "optuna_quant.trial.objective",
    "SearchSpace": "optuna_quant.trial.space",
    "TPESampler": "optuna_quant.samplers",
    "Targets": "optuna_quant.measure.loss",
    "Top1Accuracy": "optuna_quant.measure.evaluate",
    "create_study": "optuna_quant.study",
    "prior_for_space": "optuna_quant.trial.guidance",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"

_compat.install()


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'optuna_quant' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
