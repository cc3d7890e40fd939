"""Samplers of optuna-quant: plain Optuna samplers, usable on any study.

- :class:`TPESampler`: TPE re-implemented after Bergstra et al. (2011), with OpenVINO POT's preset
  (:meth:`TPESampler.pot`) and a rule that never spends a trial on a configuration seen before.
- :class:`DiscreteGPSampler`: a Gaussian-process sampler on the discrete space itself, after Intel
  Neural Compressor's Bayesian strategy, modelling the targets as constraints.
"""

from __future__ import annotations

from optuna_quant.samplers._gp import acq_max
from optuna_quant.samplers._gp import BayesianOptimization
from optuna_quant.samplers._gp import DiscreteGPSampler
from optuna_quant.samplers._gp import TargetSpace
from optuna_quant.samplers._tpe import TPESampler


__all__ = ["BayesianOptimization", "DiscreteGPSampler", "TPESampler", "TargetSpace", "acq_max"]
