"""Parzen estimators of the Tree-structured Parzen Estimator (Bergstra et al. 2011).

TPE models the good and the bad observations of a study with one Parzen estimator each. This
module holds the estimators, on the parameters and kernels of
:mod:`optuna_quant.samplers._tpe.probability_distributions`;
:mod:`optuna_quant.samplers._tpe.sampler` decides what to fit them to, and
:mod:`optuna_quant.samplers._tpe.candidates` which candidate to propose.

- :class:`UnivariateParzen` models each parameter on its own, as hyperopt's TPE and OpenVINO POT
  do: a categorical is the distribution of the weighted counts plus ``prior_weight`` pseudo-counts
  per choice; a number is a mixture of one Gaussian per observation and one wide prior Gaussian.
- :class:`MultivariateParzen` models the parameters jointly: a mixture with one product kernel per
  observation plus a prior kernel (uniform, or a categorical's ``prior`` probabilities).

Example:
    >>> import numpy as np
    >>> dims = [CategoricalDim(3), NumericDim(0.0, 10.0, step=None, log=False)]
    >>> observed = np.array([[0, 2.0], [0, 3.0], [2, 8.0]])
    >>> estimator = MultivariateParzen(observed, dims, np.ones(3), prior_weight=1.0)
    >>> samples = estimator.sample(np.random.RandomState(0), 5)
    >>> samples.shape, estimator.log_pdf(samples).shape
    ((5, 2), (5,))
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np

from optuna_quant.samplers._tpe.probability_distributions import CategoricalDim
from optuna_quant.samplers._tpe.probability_distributions import Dim
from optuna_quant.samplers._tpe.probability_distributions import gaussian_log_pdf
from optuna_quant.samplers._tpe.probability_distributions import logsumexp
from optuna_quant.samplers._tpe.probability_distributions import NumericDim
from optuna_quant.samplers._tpe.probability_distributions import sample_categorical
from optuna_quant.samplers._tpe.probability_distributions import sample_gaussians


def linear_forgetting_weights(n: int, flat: int = 25) -> np.ndarray:
    """Weights of ``n`` observations in trial order: the newest ``flat`` weigh 1, older ones less.

    Bergstra et al. (2013) let old observations fade linearly so that the model follows the
    search; hyperopt and Optuna use the same ramp.

    Example:
        >>> linear_forgetting_weights(3).tolist(), linear_forgetting_weights(27)[:2].tolist()
        ([1.0, 1.0, 1.0], [0.037037037037037035, 1.0])
    """
    if n <= flat:
        return np.ones(n)
    return np.concatenate([np.linspace(1.0 / n, 1.0, num=n - flat), np.ones(flat)])


def gaussian_kernels(x: np.ndarray, dim: NumericDim) -> tuple[np.ndarray, np.ndarray]:
    """Centres and bandwidths of the Gaussians of observations ``x`` (values), the prior last.

    The prior is centred on the range with the range's width as bandwidth. Each observation's
    bandwidth is the larger distance to its neighbours, the prior's centre counting as one (Bergstra
    et al. 2011), a lone observation gets half the range; all are clipped to
    ``[width / min(100, n + 2), width]``.

    Example:
        >>> mus, sigmas = gaussian_kernels(np.array([1.0, 9.0]), NumericDim(0.0, 10.0, None, False))
        >>> mus.tolist(), sigmas.tolist()
        ([1.0, 9.0, 5.0], [4.0, 4.0, 10.0])
    """
    low, high = dim.bounds
    prior_mu, width = 0.5 * (low + high), high - low
    u = dim.to_kernel(x)
    n = len(u)
    if n == 1:
        sigmas = np.array([0.5 * width])
    elif n >= 2:
        order = np.argsort(u, kind="stable")
        pos = int(np.searchsorted(u[order], prior_mu))
        points = np.insert(u[order], pos, prior_mu)
        gaps = np.diff(points)
        around = np.empty(n + 1)
        around[1:-1] = np.maximum(gaps[:-1], gaps[1:])
        around[0], around[-1] = gaps[0], gaps[-1]
        sigmas = np.empty(n)
        sigmas[order] = np.delete(around, pos)
    else:
        sigmas = np.empty(0)
    sigmas = np.clip(sigmas, width / min(100.0, n + 2.0), width)
    return np.append(u, prior_mu), np.append(sigmas, width)


class _Parzen(abc.ABC):
    """What both estimators share: the parameters split by kind, the mixture weights (one per
    observation, the prior's last) and each numeric parameter's Gaussians."""

    def __init__(
        self,
        observations: np.ndarray,
        dims: Sequence[Dim],
        weights: np.ndarray,
        prior_weight: float,
    ) -> None:
        if prior_weight <= 0:
            raise ValueError(f"prior_weight must be positive, got {prior_weight!r}.")
        self._observations = np.asarray(observations, dtype=float).reshape(-1, len(dims))
        self._dims = list(dims)
        self._cat = [j for j, d in enumerate(dims) if isinstance(d, CategoricalDim)]
        self._num = [j for j, d in enumerate(dims) if isinstance(d, NumericDim)]
        mixture_weights = np.append(np.asarray(weights, dtype=float), prior_weight)
        self._mixture_weights = mixture_weights / mixture_weights.sum()
        self._gaussians = [
            gaussian_kernels(self._observations[:, j], dims[j]) for j in self._num
        ]
        self._fit_categoricals(np.asarray(weights, dtype=float), prior_weight)

    @abc.abstractmethod
    def _fit_categoricals(self, weights: np.ndarray, prior_weight: float) -> None:
        """Model the categorical parameters (``self._cat``) of the observations."""


class UnivariateParzen(_Parzen):
    """One independent model per parameter (hyperopt's and OpenVINO POT's TPE).

    Args:
        observations: ``(n, d)`` observed values (choice indices for categoricals).
        dims: The parameters, in column order.
        weights: ``(n,)`` non-negative weights of the observations.
        prior_weight: For a categorical, the pseudo-count that every choice receives; for a
            number, the weight of the prior Gaussian relative to an observation of weight 1.

    Example:
        >>> est = UnivariateParzen(np.array([[0], [0], [1]]), [CategoricalDim(3)], np.ones(3), 1.0)
        >>> np.exp(est.log_pdf(np.array([[0], [1], [2]])))[:, 0].round(3).tolist()  # (2+1, 1+1, 0+1) / 6
        [0.5, 0.333, 0.167]
    """

    def _fit_categoricals(self, weights: np.ndarray, prior_weight: float) -> None:
        self._cat_log_probs = _categorical_log_probs(
            self._observations[:, self._cat].astype(np.int64),
            [self._dims[j] for j in self._cat],
            weights,
            prior_weight,
        )

    def sample(self, rng: np.random.RandomState, size: int) -> np.ndarray:
        """``size`` draws, each parameter drawn on its own, as a ``(size, d)`` array."""
        out = np.empty((size, len(self._dims)))
        if self._cat:
            out[:, self._cat] = sample_categorical(rng, np.exp(self._cat_log_probs)[None], size)
        for j, (mus, sigmas) in zip(self._num, self._gaussians):
            k = rng.choice(len(mus), size=size, p=self._mixture_weights)
            out[:, j] = sample_gaussians(rng, mus[k], sigmas[k], self._dims[j])
        return out

    def log_pdf(self, x: np.ndarray) -> np.ndarray:
        """Log density (or probability, for discrete parameters) of each value, ``(m, d)``."""
        x = np.asarray(x, dtype=float)
        out = np.empty(x.shape)
        if self._cat:
            cat = x[:, self._cat].astype(np.int64)
            out[:, self._cat] = self._cat_log_probs[np.arange(len(self._cat)), cat]
        log_w = np.log(self._mixture_weights)
        for j, (mus, sigmas) in zip(self._num, self._gaussians):
            per_kernel = gaussian_log_pdf(x[:, j], mus, sigmas, self._dims[j]) + log_w
            out[:, j] = logsumexp(per_kernel, axis=1)
        return out


class MultivariateParzen(_Parzen):
    """A joint model: a mixture of product kernels, one per observation plus a uniform prior.

    A categorical kernel puts ``(1 + s) / (1 + K s)`` on the observed choice and ``s / (1 + K s)``
    on each other one, with ``s = prior_weight / (n + 1)``, so that the product of ``d`` kernels
    leaves no configuration with zero density.

    Args:
        observations: ``(n, d)`` observed values (choice indices for categoricals).
        dims: The parameters, in column order.
        weights: ``(n,)`` non-negative weights of the observations.
        prior_weight: The weight of the prior kernel relative to an observation of weight 1.

    Example:
        >>> est = MultivariateParzen(np.array([[0, 1]]), [CategoricalDim(2)] * 2, np.ones(1), 1.0)
        >>> # kernel rows (1.5, 0.5)/2 and (0.5, 1.5)/2, prior (0.5, 0.5); weights 1/2 each
        >>> round(float(np.exp(est.log_pdf(np.array([[0, 1]])))[0]), 6)  # (0.75 * 0.75 + 0.25) / 2
        0.40625
    """

    def _fit_categoricals(self, weights: np.ndarray, prior_weight: float) -> None:
        n = len(self._observations)
        n_choices = np.array([self._dims[j].n_choices for j in self._cat], dtype=np.int64)
        max_choices = int(n_choices.max()) if len(n_choices) else 1
        valid = np.arange(max_choices)[None, :] < n_choices[:, None]
        smoothing = prior_weight / (n + 1)
        # probs[j, k, c]: kernel k's probability of choice c of categorical j; kernel n is the prior.
        probs = np.where(valid[:, None, :], smoothing, 0.0).repeat(n + 1, axis=1)
        cat_obs = self._observations[:, self._cat].astype(np.int64)
        probs[np.arange(len(self._cat))[None, :], np.arange(n)[:, None], cat_obs] += 1.0
        probs[:, :n, :] /= (1.0 + n_choices * smoothing)[:, None, None]
        probs[:, n, :] = _padded_priors([self._dims[j] for j in self._cat], max_choices)
        self._cat_probs = probs
        # Log probabilities as a (n_cat * max_choices, n_kernels) matrix, so that a one-hot
        # encoding of the candidates picks and sums them in one product; padding is never picked.
        self._max_choices = max_choices
        log_probs = np.log(np.where(valid[:, None, :], probs, 1.0))
        self._cat_log_table = log_probs.transpose(0, 2, 1).reshape(-1, n + 1)

    def sample(self, rng: np.random.RandomState, size: int) -> np.ndarray:
        """``size`` joint draws as a ``(size, d)`` array."""
        k = rng.choice(len(self._mixture_weights), size=size, p=self._mixture_weights)
        out = np.empty((size, len(self._dims)))
        if self._cat:
            out[:, self._cat] = sample_categorical(rng, self._cat_probs[:, k, :].transpose(1, 0, 2), size)
        for j, (mus, sigmas) in zip(self._num, self._gaussians):
            out[:, j] = sample_gaussians(rng, mus[k], sigmas[k], self._dims[j])
        return out

    def log_pdf(self, x: np.ndarray) -> np.ndarray:
        """Joint log density (or probability, when every parameter is discrete), ``(m,)``."""
        x = np.asarray(x, dtype=float)
        per_kernel = np.tile(np.log(self._mixture_weights), (len(x), 1))
        if self._cat:
            cat = x[:, self._cat].astype(np.int64) + np.arange(len(self._cat)) * self._max_choices
            one_hot = np.zeros((len(x), self._cat_log_table.shape[0]))
            one_hot[np.arange(len(x))[:, None], cat] = 1.0
            per_kernel += one_hot @ self._cat_log_table
        for j, (mus, sigmas) in zip(self._num, self._gaussians):
            per_kernel += gaussian_log_pdf(x[:, j], mus, sigmas, self._dims[j])
        return logsumexp(per_kernel, axis=1)


def _padded_priors(dims: Sequence[CategoricalDim], max_choices: int) -> np.ndarray:
    """``(n_cat, max_choices)`` prior probabilities of the choices, zero past each one's last."""
    out = np.zeros((len(dims), max_choices))
    for j, d in enumerate(dims):
        out[j, : d.n_choices] = d.prior_probs()
    return out


def _categorical_log_probs(
    observations: np.ndarray, dims: Sequence[CategoricalDim], weights: np.ndarray, prior_weight: float
) -> np.ndarray:
    """``(n_cat, max_choices)`` log probabilities of weighted counts plus pseudo-counts.

    Each choice gets ``prior_weight * n_choices * prior_probability`` pseudo-counts: with a
    uniform prior, ``prior_weight`` each, as hyperopt gives them.
    """
    n_choices = np.array([d.n_choices for d in dims], dtype=np.int64)
    n_cat = len(n_choices)
    max_choices = int(n_choices.max()) if n_cat else 1
    counts = np.bincount(
        (observations + np.arange(n_cat) * max_choices).ravel(),
        weights=np.repeat(weights[:, None], n_cat, axis=1).ravel(),
        minlength=n_cat * max_choices,
    ).reshape(n_cat, max_choices)
    valid = np.arange(max_choices)[None, :] < n_choices[:, None]
    # Relative to uniform: exactly 1 for a parameter without a prior.
    relative = np.ones((n_cat, max_choices))
    for j, d in enumerate(dims):
        if d.prior is not None:
            relative[j, : d.n_choices] = d.n_choices * d.prior_probs()
    pseudo_counts = prior_weight * relative
    pseudo = np.where(valid, counts + pseudo_counts, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(pseudo / pseudo.sum(axis=1, keepdims=True))
