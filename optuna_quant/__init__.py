"""optuna-quant: tune post-training int8 quantization of ONNX and PyTorch models with Optuna."""

from __future__ import annotations

from optuna_quant.evaluate import Top1Accuracy
from optuna_quant.latency import BenchmarkSettings
from optuna_quant.loss import Targets
from optuna_quant.objective import QuantizationObjective
from optuna_quant.results import BestResult
from optuna_quant.samplers import DiscreteGPSampler
from optuna_quant.samplers import TPESampler
from optuna_quant.space import QuantConfig
from optuna_quant.space import SearchSpace
from optuna_quant.study import create_study
from optuna_quant.study import QuantStudy

__all__ = [
    "BenchmarkSettings",
    "BestResult",
    "DiscreteGPSampler",
    "QuantConfig",
    "QuantStudy",
    "QuantizationObjective",
    "SearchSpace",
    "TPESampler",
    "Targets",
    "Top1Accuracy",
    "create_study",
]
__version__ = "0.1.0"
