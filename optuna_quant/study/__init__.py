"""A quantization study on Optuna: ``create_study``, its workers and POT's load methods."""

from __future__ import annotations

from optuna_quant.study.create import create_study
from optuna_quant.study.study import QuantStudy


__all__ = ["QuantStudy", "create_study"]
