"""INC's ``BayesianOptimization`` driver: register evaluated points, suggest the next one."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import numpy as np

from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._gp.acqf import ConstrainedExpectedImprovement
from optuna_quant.samplers._gp.acqf import ExpectedImprovement
from optuna_quant.samplers._gp.acqf import PriorWeighted
from optuna_quant.samplers._gp.acqf import UpperConfidenceBound
from optuna_quant.samplers._gp.gp import DiscreteGP
from optuna_quant.samplers._gp.optim import acq_max
from optuna_quant.samplers._gp.target_space import as_rng
from optuna_quant.samplers._gp.target_space import RandomSeed
from optuna_quant.samplers._gp.target_space import TargetSpace
from optuna_quant.samplers._gp.warp import warp


class BayesianOptimization:
    """Bayesian optimisation over the choice indices of ``pbounds``; maximises the target.

    Register evaluated points in :attr:`space` (``space.register(params, target)``, with
    ``constraints=`` when there are any), then call :meth:`suggest` for the next point. The target
    and each constraint get their own :class:`~optuna_quant.samplers._gp.gp.DiscreteGP`; their hyperparameters are
    warm-started from the previous call, which keeps each call cheap.

    Args:
        pbounds: Index bounds ``(0, number_of_choices)`` by parameter name.
        random_seed: Seed or ``np.random.RandomState`` of every random draw.
        ordinal: Names of parameters whose index order is meaningful (integers, stepped floats).
        acquisition: ``"ei"`` (log expected improvement, default) or ``"ucb"`` (INC's). With
            constraints, expected improvement times the probability of feasibility is used.
        n_warmup: Random candidates scored per suggestion (see :func:`acq_max`).
        n_iter: Coordinate searches per suggestion (see :func:`acq_max`).
        candidate_budget: If given, at most ``candidate_budget // n`` random candidates (and never
            fewer than 256) are scored with ``n`` registered points: scoring a candidate costs
            ``O(n^2)``, and this keeps the cost of a suggestion about flat over a long run.

    Example:
        >>> bo = BayesianOptimization({"x": (0, 5), "y": (0, 4)}, random_seed=0)
        >>> for _ in range(8):
        ...     params = bo.suggest()
        ...     bo.space.register(params, target=-(params["x"] - 3) ** 2 - (params["y"] - 1) ** 2)
        >>> len(bo.res), bo.max["target"] <= 0
        (8, True)
    """

    def __init__(
        self,
        pbounds: Mapping[str, tuple[float, float]],
        random_seed: RandomSeed = 9527,
        *,
        ordinal: Iterable[str] = (),
        acquisition: str = "ei",
        n_warmup: int = 10000,
        n_iter: int = 10,
        candidate_budget: int | None = None,
    ) -> None:
        if acquisition not in ("ei", "ucb"):
            raise ValueError(f"acquisition must be 'ei' or 'ucb', got {acquisition!r}.")
        self._random_state = as_rng(random_seed)
        self._space = TargetSpace(pbounds, self._random_state)
        if np.any(self._space.bounds[:, 0] != 0):
            raise ValueError(f"Bounds must be (0, number_of_choices), got {pbounds!r}.")
        ordinal_names = set(ordinal)
        n_choices = (self._space.bounds[:, 1] - self._space.bounds[:, 0]).astype(np.int64)
        self._n_choices = n_choices
        self._ordinal = [key in ordinal_names for key in self._space.keys]
        self._acquisition = acquisition
        self._n_warmup = n_warmup
        self._n_iter = n_iter
        self._candidate_budget = candidate_budget
        self._target_gp = self._new_gp()
        self._constraint_gps: list[DiscreteGP] = []

    @property
    def space(self) -> TargetSpace:
        """The evaluated points."""
        return self._space

    @property
    def max(self) -> dict[str, Any]:
        """The best feasible point: ``{"target": ..., "params": ...}``, or ``{}``."""
        return self._space.max()

    @property
    def res(self) -> list[dict[str, Any]]:
        """Every evaluated point, in order of registration."""
        return self._space.res()

    def suggest(
        self,
        pending: np.ndarray | None = None,
        exclude: Iterable[Config] = (),
        *,
        log_prior: Callable[[np.ndarray], np.ndarray] | None = None,
        prior_weight: float = 1.0,
    ) -> dict[str, int]:
        """Suggest the most promising point that is neither registered nor excluded.

        Args:
            pending: ``(m, dim)`` points being evaluated elsewhere: the models believe their own
                prediction there (kriging believer), which steers the suggestion away from them.
            exclude: Further points never to suggest (failed ones, say); registered and pending
                points are never suggested either.
            log_prior: ``(m, dim)`` points to their ``(m,)`` log prior probabilities; the
                acquisition is then weighted by the prior (:class:`~.acqf.PriorWeighted`).
                Expected improvement only: UCB is not in log units.
            prior_weight: The prior's exponent.

        Raises:
            ValueError: If every point is registered, pending or excluded.
        """
        space = self._space
        pending = np.empty((0, space.dim), np.int64) if pending is None else np.asarray(pending)
        # A set keeps its kind through the union: an Excluded's forbidden combinations stay in.
        excluded = (exclude if isinstance(exclude, set) else set(exclude)) | set(space._cache)
        excluded |= {tuple(p) for p in pending.tolist()}
        if space.empty:
            return space.array_to_params(self._random_unseen(excluded))

        target = warp(space.target, centre=float(np.median(space.target)))
        feasible = space.feasible
        y_max = float(np.max(target[feasible])) if feasible.any() else None
        # Until a point is feasible only the constraints' models are consulted.
        gp = None
        if y_max is not None:  # always so without constraints: every point is feasible then
            gp = self._target_gp.fit(space.params, target).with_pending(pending)
        if space.constraints is None:
            ac: Callable[..., np.ndarray] = (
                UpperConfidenceBound() if self._acquisition == "ucb" else ExpectedImprovement()
            )
        else:
            ac = ConstrainedExpectedImprovement(self._fit_constraint_models(pending))
        if log_prior is not None and self._acquisition == "ei":
            ac = PriorWeighted(ac, log_prior, prior_weight)
        x = acq_max(
            ac,
            gp,
            y_max,
            space.bounds,
            self._random_state,
            n_warmup=self._warmup_size(),
            n_iter=self._n_iter,
            exclude=excluded,
            anchors=self._anchors(target),
        )
        return space.array_to_params(x)

    def gen_next_params(self) -> dict[str, int]:
        """The next point to evaluate (INC's name for :meth:`suggest`)."""
        return self.suggest()

    def _warmup_size(self) -> int:
        if self._candidate_budget is None:
            return self._n_warmup
        return max(256, min(self._n_warmup, self._candidate_budget // len(self._space)))

    def _new_gp(self) -> DiscreteGP:
        return DiscreteGP(self._n_choices, self._ordinal)

    def _fit_constraint_models(self, pending: np.ndarray) -> list[DiscreteGP]:
        constraints = self._space.constraints
        while len(self._constraint_gps) < constraints.shape[1]:
            self._constraint_gps.append(self._new_gp())
        return [
            gp.fit(self._space.params, warp(values, centre=0.0)).with_pending(pending)
            for gp, values in zip(self._constraint_gps, constraints.T)
        ]

    def _anchors(self, target: np.ndarray, k: int = 5) -> np.ndarray:
        """The ``k`` best points: feasible ones by target, then the least infeasible."""
        space = self._space
        if space.constraints is None:
            order = np.argsort(-target)
        else:
            # Warped, so that constraints of different units weigh alike.
            warped = np.column_stack([warp(c, centre=0.0) for c in space.constraints.T])
            violation = np.sum(np.maximum(warped, 0.0), axis=1)
            order = np.lexsort((-target, violation))
        return space.params[order[:k]]

    def _random_unseen(self, excluded: set[Config]) -> np.ndarray:
        for _ in range(1000):
            x = self._space.random_sample()
            if tuple(x.tolist()) not in excluded:
                return x
        raise ValueError("No unexcluded point found by random sampling.")

