"""Pruners of optuna-quant: plain Optuna pruners, for the studies that a
:class:`~optuna_quant.trial.objective.QuantizationObjective` runs.

- :class:`LatencyPruner`: stops a trial's timing once every block timed says that its model
  cannot beat the best model within the accuracy target.
"""

from __future__ import annotations

from optuna_quant.pruners._latency import LatencyPruner


__all__ = ["LatencyPruner"]
