"""The parameters as the Parzen estimators see them, and the kernels' draws and densities.

Coordinates are those of Optuna's internal representation: a categorical value is its choice
index, a number is its value. Numeric kernels are Gaussians truncated to the parameter's range (in
log space for log-scaled parameters); for a parameter with a step, a kernel gives each grid value
the Gaussian mass of the cell of width ``step`` around it.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
from typing import NamedTuple
from typing import Union

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution

from optuna_quant.samplers._tpe.truncnorm import log_gauss_mass


class CategoricalDim(NamedTuple):
    """A parameter whose values are the choice indices ``0 .. n_choices - 1``.

    ``prior``: the prior probability of each choice (uniform when ``None``), which the prior
    kernel of an estimator follows.
    """

    n_choices: int
    prior: tuple[float, ...] | None = None

    def prior_probs(self) -> np.ndarray:
        """The prior probability of each choice."""
        if self.prior is None:
            return np.full(self.n_choices, 1.0 / self.n_choices)
        return np.asarray(self.prior, dtype=float)


class NumericDim(NamedTuple):
    """An integer or float parameter on ``[low, high]``, on a grid of ``step`` unless it is None."""

    low: float
    high: float
    step: float | None
    log: bool

    @property
    def bounds(self) -> tuple[float, float]:
        """The kernels' support in kernel coordinates: widened by half a step, log if ``log``."""
        low, high = self.low, self.high
        if self.step is not None:
            low, high = low - self.step / 2, high + self.step / 2
        if self.log:
            return math.log(low), math.log(high)
        return low, high

    def to_kernel(self, x: np.ndarray) -> np.ndarray:
        """Values in the coordinates the Gaussians live in."""
        return np.log(x) if self.log else np.asarray(x, dtype=float)

    def from_kernel(self, u: np.ndarray) -> np.ndarray:
        """Kernel coordinates back to values, snapped to the grid when there is a step."""
        x = np.exp(u) if self.log else u
        if self.step is not None:
            x = self.low + np.rint((x - self.low) / self.step) * self.step
        return np.clip(x, self.low, self.high)


Dim = Union[CategoricalDim, NumericDim]


def dim_of(distribution: BaseDistribution) -> Dim:
    """The estimator's view of an Optuna distribution.

    Example:
        >>> from optuna.distributions import IntDistribution
        >>> dim_of(IntDistribution(1, 9, step=2))
        NumericDim(low=1.0, high=9.0, step=2.0, log=False)
    """
    if isinstance(distribution, CategoricalDistribution):
        return CategoricalDim(len(distribution.choices))
    if isinstance(distribution, IntDistribution):
        return NumericDim(
            float(distribution.low), float(distribution.high), float(distribution.step), distribution.log
        )
    if isinstance(distribution, FloatDistribution):
        step = None if distribution.step is None else float(distribution.step)
        return NumericDim(float(distribution.low), float(distribution.high), step, distribution.log)
    raise TypeError(f"Unsupported distribution {distribution!r}.")


def sample_uniform(rng: np.random.RandomState, dims: Sequence[Dim]) -> np.ndarray:
    """One uniform draw (log-uniform for log-scaled numbers)."""
    x = np.empty(len(dims))
    for j, d in enumerate(dims):
        if isinstance(d, CategoricalDim):
            x[j] = rng.randint(d.n_choices)
        else:
            low, high = d.bounds
            x[j] = d.from_kernel(np.array([rng.uniform(low, high)]))[0]
    return x


def sample_categorical(rng: np.random.RandomState, probs: np.ndarray, size: int) -> np.ndarray:
    """Draw from ``probs`` of shape ``(1 or size, n_cat, max_choices)``: ``(size, n_cat)`` indices."""
    cum = np.cumsum(probs, axis=-1)
    cum[..., -1] = 1.0  # rounding must not leave room past the last choice
    u = rng.random_sample((size, probs.shape[1]))
    return (u[..., None] >= cum).sum(axis=-1)


def sample_gaussians(
    rng: np.random.RandomState, mus: np.ndarray, sigmas: np.ndarray, dim: NumericDim
) -> np.ndarray:
    """One draw from each truncated Gaussian, returned as values on the parameter's grid."""
    low, high = dim.bounds
    out = np.empty(len(mus))
    todo = np.arange(len(mus))
    # Centres lie in the range and bandwidths are at most its width, so a draw lands in it with
    # probability above 1/3: rejection ends quickly.
    while todo.size:
        u = rng.normal(mus[todo], sigmas[todo])
        inside = (u >= low) & (u <= high)
        out[todo[inside]] = u[inside]
        todo = todo[~inside]
    return dim.from_kernel(out)


def gaussian_log_pdf(
    x: np.ndarray, mus: np.ndarray, sigmas: np.ndarray, dim: NumericDim
) -> np.ndarray:
    """``(m, n_kernels)`` log density (continuous) or log mass (with a step) of each kernel."""
    low, high = dim.bounds
    log_z = log_gauss_mass((low - mus) / sigmas, (high - mus) / sigmas)
    if dim.step is None:
        u = dim.to_kernel(x)[:, None]
        z = (u - mus) / sigmas
        log_pdf = -0.5 * z**2 - np.log(sigmas * math.sqrt(2 * math.pi)) - log_z
        return log_pdf - u if dim.log else log_pdf
    left = dim.to_kernel(x - dim.step / 2)[:, None]
    right = dim.to_kernel(x + dim.step / 2)[:, None]
    return log_gauss_mass((left - mus) / sigmas, (right - mus) / sigmas) - log_z


def logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    """``log(sum(exp(a)))`` along ``axis``, without overflow; ``-inf`` where every term is."""
    top = np.max(a, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(a - top), axis=axis)) + np.squeeze(top, axis=axis)
