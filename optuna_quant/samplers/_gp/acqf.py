"""Acquisition functions: INC's upper confidence bound, log expected improvement, and expected
improvement weighted by the probability of feasibility.

Each is called as ``ac(x, gp=gp, y_max=y_max)`` on ``(m, dim)`` index vectors and answers ``(m,)``
scores, higher being more promising; the target is maximised, as in INC.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
import math
from typing import Any

import numpy as np
from scipy.special import erfcx
from scipy.special import log_ndtr


Model = Any  # anything with ``predict(X, return_std=True) -> (mean, std)``


class UpperConfidenceBound:
    """INC's acquisition: ``mean + kappa * std``.

    Example:
        >>> import numpy as np
        >>> from optuna_quant.samplers._gp.gp import DiscreteGP
        >>> gp = DiscreteGP([2, 2]).fit(np.array([[0, 0], [1, 1]]), np.array([0.0, 1.0]))
        >>> UpperConfidenceBound()(np.array([[0, 1]]), gp=gp, y_max=1.0).shape
        (1,)
    """

    def __init__(self, kappa: float = 2.576) -> None:
        self.kappa = kappa

    def __call__(self, x: np.ndarray, gp: Model, y_max: float | None) -> np.ndarray:
        mean, std = gp.predict(x, return_std=True)
        return mean + self.kappa * std


class ExpectedImprovement:
    """The logarithm of the expected improvement over ``y_max`` (maximisation).

    The log form (Ament et al., 2023) keeps candidates far below the incumbent apart, where plain
    EI underflows to zero and leaves the choice to chance.

    Example:
        >>> import numpy as np
        >>> from optuna_quant.samplers._gp.gp import DiscreteGP
        >>> gp = DiscreteGP([2, 2]).fit(np.array([[0, 0], [1, 1]]), np.array([0.0, 1.0]))
        >>> ei = ExpectedImprovement()(np.array([[0, 1], [1, 0]]), gp=gp, y_max=1.0)
        >>> bool(np.all(np.isfinite(ei)))
        True
    """

    def __init__(self, xi: float = 0.0) -> None:
        self.xi = xi

    def __call__(self, x: np.ndarray, gp: Model, y_max: float | None) -> np.ndarray:
        mean, std = gp.predict(x, return_std=True)
        if y_max is None:
            return mean
        return _log_ei(mean, std, y_max + self.xi)


class ConstrainedExpectedImprovement:
    """Expected improvement times the probability that every constraint holds, in logs.

    The target and each constraint have their own model; constraint ``c`` holds where
    ``c(x) <= 0``. Without a feasible point yet (``y_max is None``) only the probability of
    feasibility counts: reaching the feasible region is the first goal.

    Args:
        constraint_models: One model per constraint, predicting the constraint value.
    """

    def __init__(self, constraint_models: Sequence[Model]) -> None:
        self.constraint_models = list(constraint_models)

    def log_pof(self, x: np.ndarray) -> np.ndarray:
        """The log probability that every constraint holds at ``x``."""
        total = np.zeros(len(x))
        for model in self.constraint_models:
            mean, std = model.predict(x, return_std=True)
            total += log_ndtr(-mean / std)
        return total

    def __call__(self, x: np.ndarray, gp: Model, y_max: float | None) -> np.ndarray:
        log_pof = self.log_pof(x)
        if y_max is None:
            return log_pof
        mean, std = gp.predict(x, return_std=True)
        return _log_ei(mean, std, y_max) + log_pof


def _log_ei(mean: np.ndarray, std: np.ndarray, y_max: float) -> np.ndarray:
    z = (mean - y_max) / std
    return np.log(std) + _log_h(z)


def _log_h(z: np.ndarray) -> np.ndarray:
    """``log(phi(z) + z * Phi(z))`` without cancellation for negative ``z``."""
    out = np.empty_like(z)
    upper = z > -1.0
    zu = z[upper]
    out[upper] = np.log(np.exp(-0.5 * zu**2) / math.sqrt(2 * math.pi) + zu * np.exp(log_ndtr(zu)))
    zl = np.maximum(z[~upper], -1e6)
    # phi(z) + z Phi(z) = phi(z) * (1 - |z| * erfcx(|z| / sqrt 2) * sqrt(pi / 2)) for z < 0.
    tail = 1.0 - np.abs(zl) * erfcx(np.abs(zl) / math.sqrt(2)) * math.sqrt(math.pi / 2)
    out[~upper] = -0.5 * zl**2 - 0.5 * math.log(2 * math.pi) + np.log(np.maximum(tail, 1e-300))
    return out


class PriorWeighted:
    """An acquisition in log units plus ``weight`` times a log prior: piBO (Hvarfner et al. 2022).

    piBO multiplies the acquisition by the prior raised to ``beta / n`` after ``n`` observations,
    so that the prior leads early and the data later; in logs that is an added term.

    Args:
        acquisition: An acquisition whose scores are logarithms (log EI, log probability of
            feasibility).
        log_prior: ``(m, dim)`` points to their ``(m,)`` log prior probabilities.
        weight: The exponent ``beta / n``.

    Example:
        >>> import numpy as np
        >>> from optuna_quant.samplers._gp.gp import DiscreteGP
        >>> gp = DiscreteGP([2, 2]).fit(np.array([[0, 0], [1, 1]]), np.array([0.0, 1.0]))
        >>> x = np.array([[0, 1], [1, 0]])
        >>> plain = ExpectedImprovement()(x, gp=gp, y_max=1.0)
        >>> weighted = PriorWeighted(ExpectedImprovement(), lambda x: np.log([0.9, 0.1]), 2.0)
        >>> np.allclose(weighted(x, gp=gp, y_max=1.0) - plain, 2.0 * np.log([0.9, 0.1]))
        True
    """

    def __init__(
        self,
        acquisition: Callable[..., np.ndarray],
        log_prior: Callable[[np.ndarray], np.ndarray],
        weight: float,
    ) -> None:
        self.acquisition = acquisition
        self.log_prior = log_prior
        self.weight = weight

    def __call__(self, x: np.ndarray, gp: Model, y_max: float | None) -> np.ndarray:
        return self.acquisition(x, gp=gp, y_max=y_max) + self.weight * self.log_prior(x)
