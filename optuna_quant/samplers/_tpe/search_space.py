"""The TPE sampler's view of a search space: whether the never-repeat rule can list it, and its
points as the estimators' values (:mod:`optuna_quant.samplers._tpe.probability_distributions`).

On a finite space the sampler keeps a :class:`~optuna_quant.samplers._discrete.DiscreteSpace`'s
index configurations, which :func:`values_of` and :func:`indices_of` convert; on another, the
history holds Optuna's internal values themselves (:func:`continuous_history`).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.study import Study
from optuna.trial import FrozenTrial

from optuna_quant.samplers._discrete import grid_size
from optuna_quant.samplers._discrete import History
from optuna_quant.samplers._tpe.probability_distributions import Dim
from optuna_quant.samplers._tpe.probability_distributions import NumericDim


# Values of one numeric parameter beyond which the space is treated as continuous.
_MAX_LISTED_VALUES = 10_000


def is_finite(distribution: BaseDistribution) -> bool:
    """Whether the never-repeat rule can list the parameter's values.

    A float without a step cannot; nor, in practice, an integer range of millions, whose values
    a repeat would hardly hit anyway.
    """
    n_values = grid_size(distribution)
    return n_values is not None and n_values <= _MAX_LISTED_VALUES


def min_choices(distributions: Iterable[BaseDistribution]) -> int | None:
    """POT's ``M``: the fewest choices of a finite parameter with more than one."""
    counts = [n for n in map(grid_size, distributions) if n is not None and n > 1]
    return min(counts) if counts else None


def values_of(configs: np.ndarray, dims: Sequence[Dim]) -> np.ndarray:
    """Index configurations of a :class:`~optuna_quant.samplers._discrete.DiscreteSpace` as the estimators' values."""
    x = np.asarray(configs, dtype=float).reshape(-1, len(dims))
    for j, d in enumerate(dims):
        if isinstance(d, NumericDim):
            x[:, j] = d.low + x[:, j] * d.step  # type: ignore[operator]
    return x


def indices_of(x: np.ndarray, dims: Sequence[Dim]) -> np.ndarray:
    """The estimators' values as index configurations of a :class:`~optuna_quant.samplers._discrete.DiscreteSpace`."""
    configs = np.array(x, dtype=float)
    for j, d in enumerate(dims):
        if isinstance(d, NumericDim):
            configs[:, j] = (configs[:, j] - d.low) / d.step  # type: ignore[operator]
    return np.rint(configs).astype(np.int64)


def continuous_history(
    study: Study,
    trials: Sequence[FrozenTrial],
    names: Sequence[str],
    search_space: Mapping[str, BaseDistribution],
) -> History:
    """A :class:`History` whose configurations are Optuna's internal values, for spaces that are
    not finite."""

    def encode(trial: FrozenTrial) -> list[float] | None:
        if any(trial.distributions.get(name) != search_space[name] for name in names):
            return None
        return [search_space[name].to_internal_repr(trial.params[name]) for name in names]

    return History.collect(study, trials, encode, len(names), float)
