"""Bayesian optimisation on a discrete space: INC's Bayesian pieces, and an Optuna sampler.

The public pieces keep the names and meanings of INC's Bayesian tuning strategy
(``neural_compressor.strategy.bayesian``): a :class:`TargetSpace` of evaluated points, a
:class:`BayesianOptimization` driver with ``suggest``, and :func:`acq_max`. As in INC the target is
*maximised*, points are vectors of choice indices and ``pbounds`` maps each parameter name to the
index range ``(0, number_of_choices)``. Where INC was weak this module does otherwise:

- INC fitted a Matern GP on the index vectors as if they were continuous, maximised UCB with
  L-BFGS-B and truncated the optimum to indices; the truncated point was often one already
  evaluated. Here the GP works on the discrete space itself (:class:`~._gp.gp.DiscreteGP`:
  additive plus Hamming kernel), and the acquisition is maximised over discrete candidates only,
  never over a point already evaluated or running.
- INC offered UCB only; here expected improvement is the default, with a log formulation that
  does not vanish far from the incumbent, and black-box constraints are modelled, each by its own
  GP (expected improvement times the probability of feasibility).
- INC drew random numbers from NumPy's global state; here every random draw comes from the
  ``random_seed`` generator, so runs are reproducible.
- INC's ``register`` concatenated arrays (quadratic over a run); here appends are amortised
  constant time.

:class:`DiscreteGPSampler` runs the same machinery as an Optuna sampler on any study whose
parameters are categorical, integer or stepped float.

The pieces live in the modules of this package, one job
per module as in Optuna's ``optuna._gp``: ``target_space`` (:class:`TargetSpace`), ``gp`` (the
discrete kernel GP), ``acqf`` (acquisition functions), ``optim`` (:func:`acq_max`), ``warp``
(output warping), ``bayesian_optimization`` (:class:`BayesianOptimization`) and ``sampler``
(:class:`DiscreteGPSampler`).
"""

from __future__ import annotations

from optuna_quant.samplers._gp.acqf import ConstrainedExpectedImprovement
from optuna_quant.samplers._gp.acqf import ExpectedImprovement
from optuna_quant.samplers._gp.acqf import PriorWeighted
from optuna_quant.samplers._gp.acqf import UpperConfidenceBound
from optuna_quant.samplers._gp.bayesian_optimization import BayesianOptimization
from optuna_quant.samplers._gp.optim import acq_max
from optuna_quant.samplers._gp.sampler import DiscreteGPSampler
from optuna_quant.samplers._gp.target_space import TargetSpace


__all__ = [
    "BayesianOptimization",
    "ConstrainedExpectedImprovement",
    "DiscreteGPSampler",
    "ExpectedImprovement",
    "PriorWeighted",
    "TargetSpace",
    "UpperConfidenceBound",
    "acq_max",
]
