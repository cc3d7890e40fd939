"""Bayesian optimisation on a discrete space: INC's Bayesian pieces, and an Optuna sampler.

The public pieces keep the names and meanings of INC's Bayesian tuning strategy
(``neural_compressor.strategy.bayesian``): a :class:`TargetSpace` of evaluated points, a
:class:`BayesianOptimization` driver with ``suggest``, and :func:`acq_max`. As in INC the target is
*maximised*, points are vectors of choice indices and ``pbounds`` maps each parameter name to the
index range ``(0, number_of_choices)``. Where INC was weak this module does otherwise:

- INC fitted a Matern GP on the index vectors as if they were continuous, maximised UCB with
  L-BFGS-B and truncated the optimum to indices; the truncated point was often one already
  evaluated. Here the GP works on the discrete space itself (:class:`~._gp_kernel.DiscreteGP`:
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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
import json
import math
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution
from optuna.samplers import BaseSampler
from optuna.search_space import IntersectionSearchSpace
from optuna.study import Study
from optuna.trial import FrozenTrial
from optuna.trial import TrialState
from scipy.special import erfcx, log_ndtr

from optuna_quant.samplers._discrete import choices_of
from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._discrete import DiscreteSpace
from optuna_quant.samplers._discrete import History
from optuna_quant.samplers._discrete import index_grid
from optuna_quant.samplers._discrete import SpaceCache
from optuna_quant.samplers._gp_kernel import DiscreteGP

__all__ = [
    "BayesianOptimization",
    "ConstrainedExpectedImprovement",
    "DiscreteGPSampler",
    "ExpectedImprovement",
    "TargetSpace",
    "UpperConfidenceBound",
    "acq_max",
]

RandomSeed = int | np.random.RandomState | None


def _as_rng(random_seed: RandomSeed) -> np.random.RandomState:
    if isinstance(random_seed, np.random.RandomState):
        return random_seed
    return np.random.RandomState(random_seed)


# -- TargetSpace --------------------------------------------------------------------------------


class TargetSpace:
    """Holds the param-space coordinates (X) and target values (Y).

    Points are vectors of choice indices, one per key (keys sorted by name); each key's bounds are
    ``(low, high)`` with ``high`` excluded, as INC wrote them (``(0, len(choices))``). Appends run
    in amortised constant time (preallocated arrays that double when full), and a point can be
    registered once only. Optionally each point also carries constraint values (feasible when all
    are ``<= 0``).

    Args:
        pbounds: Index bounds ``(low, high)`` by parameter name.
        random_seed: Seed or ``np.random.RandomState`` of :meth:`random_sample`.

    Example:
        >>> space = TargetSpace({"b": (0, 3), "a": (0, 2)}, random_seed=0)
        >>> space.keys, space.dim
        (['a', 'b'], 2)
        >>> space.register({"a": 1, "b": 2}, target=0.5)
        >>> space.register(np.array([0, 0]), target=0.9)
        >>> space.max()
        {'target': 0.9, 'params': {'a': 0, 'b': 0}}
        >>> space.register({"a": 1, "b": 2}, target=0.1)
        Traceback (most recent call last):
        ...
        KeyError: 'Data point [1 2] is not unique'
    """

    def __init__(
        self, pbounds: Mapping[str, tuple[float, float]], random_seed: RandomSeed = 9527
    ) -> None:
        self.random_state = _as_rng(random_seed)
        self._keys = sorted(pbounds)
        bounds = np.array([pbounds[key] for key in self._keys], dtype=float).reshape(-1, 2)
        if np.any(bounds != np.round(bounds)) or np.any(bounds[:, 1] <= bounds[:, 0]):
            raise ValueError(f"Bounds must be integer index ranges (low, high), got {pbounds!r}.")
        self._bounds = bounds
        self._size = 0
        self._params = np.empty((8, self.dim), dtype=np.int64)
        self._target = np.empty(8)
        self._constraints: np.ndarray | None = None
        self._cache: dict[Config, float] = {}

    def __contains__(self, x: Any) -> bool:
        return self._hashable(x) in self._cache

    def __len__(self) -> int:
        return self._size

    @property
    def empty(self) -> bool:
        """Whether no point has been registered."""
        return self._size == 0

    @property
    def params(self) -> np.ndarray:
        """All registered points, ``(n, dim)`` choice indices."""
        return self._params[: self._size]

    @property
    def target(self) -> np.ndarray:
        """All registered target values, ``(n,)``."""
        return self._target[: self._size]

    @property
    def constraints(self) -> np.ndarray | None:
        """All registered constraint values, ``(n, k)``, or ``None`` when none were given."""
        return None if self._constraints is None else self._constraints[: self._size]

    @property
    def feasible(self) -> np.ndarray:
        """Which registered points meet every constraint (all of them without constraints)."""
        if self._constraints is None:
            return np.ones(self._size, dtype=bool)
        return np.all(self.constraints <= 0, axis=1)

    @property
    def dim(self) -> int:
        """The number of parameters."""
        return len(self._keys)

    @property
    def keys(self) -> list[str]:
        """The parameter names, sorted."""
        return self._keys

    @property
    def bounds(self) -> np.ndarray:
        """The index bounds, ``(dim, 2)``, upper bound excluded."""
        return self._bounds

    def params_to_array(self, params: Mapping[str, Any]) -> np.ndarray:
        """The index vector of a dict keyed by :attr:`keys`.

        Raises:
            ValueError: If the dict's keys are not exactly :attr:`keys`.
        """
        if set(params) != set(self._keys):
            raise ValueError(
                f"Parameters' keys ({sorted(params)}) do not match the expected keys {self._keys}."
            )
        return np.asarray([params[key] for key in self._keys], dtype=np.int64)

    def array_to_params(self, x: Sequence[int] | np.ndarray) -> dict[str, int]:
        """The dict of an index vector, keyed by :attr:`keys`.

        Raises:
            ValueError: If ``x`` does not have one entry per key.
        """
        x = np.asarray(x).ravel()
        if len(x) != self.dim:
            raise ValueError(f"Size of array ({len(x)}) differs from the expected ({self.dim}).")
        return {key: int(value) for key, value in zip(self._keys, x)}

    def register(
        self,
        params: Mapping[str, Any] | Sequence[int] | np.ndarray,
        target: float,
        constraints: Sequence[float] | None = None,
    ) -> None:
        """Append a point and its target value (and constraint values) to the known data.

        Runs in amortised constant time.

        Args:
            params: A single point: a dict keyed by :attr:`keys` or an index vector.
            target: Its target function value.
            constraints: Its constraint values; give them for every point or for none.

        Raises:
            KeyError: If the point is already registered.
            ValueError: If constraints are given for some points and not for others.
        """
        x = self._as_array(params)
        key = tuple(x.tolist())
        if key in self._cache:
            raise KeyError(f"Data point {x} is not unique")
        if (constraints is None) != (self._constraints is None) and self._size > 0:
            raise ValueError("Give constraint values for every registered point or for none.")
        if self._size == len(self._target):
            self._grow()
        if constraints is not None:
            row = np.asarray(constraints, dtype=float).ravel()
            if self._constraints is None:
                self._constraints = np.empty((len(self._target), len(row)))
            self._constraints[self._size] = row
        self._params[self._size] = x
        self._target[self._size] = target
        self._cache[key] = float(target)
        self._size += 1

    def get_target(self, params: Mapping[str, Any] | Sequence[int] | np.ndarray) -> float:
        """The target value of a registered point.

        Raises:
            KeyError: If the point is not registered.
        """
        return self._cache[self._hashable(params)]

    def random_sample(self) -> np.ndarray:
        """A uniformly random point within the bounds, as an index vector of length :attr:`dim`."""
        low, high = self._bounds[:, 0], self._bounds[:, 1]
        return (low + np.floor(self.random_state.random_sample(self.dim) * (high - low))).astype(
            np.int64
        )

    def max(self) -> dict[str, Any]:
        """The highest target among feasible points, with its params; ``{}`` when there is none."""
        feasible = np.flatnonzero(self.feasible)
        if len(feasible) == 0:
            return {}
        best = feasible[np.argmax(self.target[feasible])]
        params = self.array_to_params(self.params[best])
        return {"target": float(self.target[best]), "params": params}

    def res(self) -> list[dict[str, Any]]:
        """Every registered point in order: ``{"target": ..., "params": ...}`` (and constraints)."""
        results = []
        for i in range(self._size):
            entry: dict[str, Any] = {
                "target": float(self._target[i]),
                "params": self.array_to_params(self._params[i]),
            }
            if self._constraints is not None:
                entry["constraints"] = self._constraints[i].tolist()
            results.append(entry)
        return results

    def _as_array(self, params: Mapping[str, Any] | Sequence[int] | np.ndarray) -> np.ndarray:
        if isinstance(params, Mapping):
            return self.params_to_array(params)
        x = np.asarray(params).ravel()
        if len(x) != self.dim:
            raise ValueError(f"Size of array ({len(x)}) differs from the expected ({self.dim}).")
        return x.astype(np.int64)

    def _hashable(self, params: Mapping[str, Any] | Sequence[int] | np.ndarray) -> Config:
        return tuple(self._as_array(params).tolist())

    def _grow(self) -> None:
        capacity = 2 * len(self._target)
        self._params = np.resize(self._params, (capacity, self.dim))
        self._target = np.resize(self._target, capacity)
        if self._constraints is not None:
            self._constraints = np.resize(self._constraints, (capacity, self._constraints.shape[1]))


# -- acquisition functions ----------------------------------------------------------------------

Model = Any  # anything with ``predict(X, return_std=True) -> (mean, std)``


class UpperConfidenceBound:
    """INC's acquisition: ``mean + kappa * std``.

    Example:
        >>> import numpy as np
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


# -- acq_max ------------------------------------------------------------------------------------


def acq_max(
    ac: Callable[..., np.ndarray],
    gp: Model,
    y_max: float | None,
    bounds: np.ndarray,
    random_seed: RandomSeed,
    n_warmup: int = 10000,
    n_iter: int = 10,
    *,
    exclude: Iterable[Config] = (),
    anchors: np.ndarray | None = None,
) -> np.ndarray:
    """Find the maximum of the acquisition function over the discrete points within ``bounds``.

    INC sampled ``n_warmup`` random continuous points, ran L-BFGS-B from ``n_iter`` more and
    truncated the result to indices. Here only discrete points are ever scored, and never one in
    ``exclude``:

    - a space of at most ``n_warmup`` points is scored in full (the exact maximum);
    - otherwise ``n_warmup`` random points are scored together with the one-flip neighbours and
      ``n_warmup // 4`` random two-flip neighbours of ``anchors``, then a best-improvement
      coordinate search runs from the ``n_iter`` best of them: each round scores every one-flip
      neighbour and moves to the best, until none improves.

    Args:
        ac: The acquisition function, ``ac(x, gp=gp, y_max=y_max) -> (m,)`` scores.
        gp: The model handed to ``ac``.
        y_max: The current best target (``None`` when there is none), handed to ``ac``.
        bounds: ``(dim, 2)`` integer index bounds, upper bound excluded.
        random_seed: Seed or ``np.random.RandomState`` for the random candidates.
        n_warmup: How many random points to score (and the largest space scored in full).
        n_iter: How many coordinate searches to run.
        exclude: Points never to return (evaluated, failed or running ones).
        anchors: ``(k, dim)`` points whose neighbourhoods are searched, the best observed ones.

    Returns:
        The arg max, an index vector.

    Raises:
        ValueError: If every point within ``bounds`` is excluded.

    Example:
        >>> import numpy as np
        >>> gp = DiscreteGP([2, 3]).fit(np.array([[0, 0], [1, 2]]), np.array([0.0, 1.0]))
        >>> x = acq_max(ExpectedImprovement(), gp, 1.0, np.array([[0, 2], [0, 3]]), 0,
        ...             exclude={(0, 0), (1, 2)})
        >>> tuple(x.tolist()) not in {(0, 0), (1, 2)}
        True
    """
    rng = _as_rng(random_seed)
    bounds = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
    low, n_choices = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
    excluded = exclude if isinstance(exclude, (set, frozenset)) else set(exclude)
    excluded = {tuple((np.asarray(x) - low).tolist()) for x in excluded} if low.any() else excluded
    search = _CandidateSearch(lambda x: ac(x + low, gp=gp, y_max=y_max), n_choices, excluded)
    if math.prod(int(n) for n in n_choices) <= n_warmup:
        best = search.best_of_all()
    else:
        shifted = None if anchors is None else np.asarray(anchors, dtype=np.int64) - low
        best = search.best_by_local_search(rng, n_warmup, n_iter, shifted)
    if best is None:
        raise ValueError("Every point within the bounds is excluded: nothing is left to suggest.")
    return best + low


class _CandidateSearch:
    """Maximises a score over index vectors ``0 <= x < n_choices`` outside ``excluded``."""

    _MAX_ROUNDS = 20

    def __init__(
        self, score: Callable[[np.ndarray], np.ndarray], n_choices: np.ndarray, excluded: set
    ) -> None:
        self.score = score
        self.n_choices = n_choices
        self.excluded = excluded
        self.dim = len(n_choices)

    def best_of_all(self) -> np.ndarray | None:
        candidates = self._allowed(index_grid(self.n_choices))
        if len(candidates) == 0:
            return None
        return candidates[np.argmax(self.score(candidates))]

    def best_by_local_search(
        self, rng: np.random.RandomState, n_random: int, n_starts: int, anchors: np.ndarray | None
    ) -> np.ndarray | None:
        pools = [(rng.random_sample((n_random, self.dim)) * self.n_choices).astype(np.int64)]
        if anchors is not None and len(anchors):
            pools.append(self._one_flips(anchors))
            pools.append(self._two_flips(rng, anchors, max(1, n_random // 4)))
        candidates = self._allowed(np.vstack(pools))
        if len(candidates) == 0:
            return None
        scores = self.score(candidates)
        order = np.argsort(-scores)[:n_starts]
        current, current_scores = candidates[order], scores[order]
        for _ in range(self._MAX_ROUNDS):
            # One batch per round: every one-flip neighbour of every search, scored together.
            neighbours = self._one_flips(current)
            owner = np.tile(np.arange(len(current)), len(neighbours) // max(len(current), 1))
            # Not de-duplicated: two searches may share a neighbour, and each may move there.
            keep = self._not_excluded(neighbours)
            neighbours, owner = neighbours[keep], owner[keep]
            if len(neighbours) == 0:
                break
            neighbour_scores = self.score(neighbours)
            moved = False
            for i in range(len(current)):
                mine = np.flatnonzero(owner == i)
                if len(mine) == 0:
                    continue
                j = mine[np.argmax(neighbour_scores[mine])]
                if neighbour_scores[j] > current_scores[i]:
                    current[i], current_scores[i] = neighbours[j], neighbour_scores[j]
                    moved = True
            if not moved:
                break
        return current[int(np.argmax(current_scores))]

    def _allowed(self, candidates: np.ndarray) -> np.ndarray:
        """The rows not excluded, each once, in the order they first appear."""
        candidates = candidates[self._not_excluded(candidates)]
        _, first = np.unique(candidates, axis=0, return_index=True)
        return candidates[np.sort(first)]

    def _not_excluded(self, candidates: np.ndarray) -> np.ndarray:
        rows = map(tuple, candidates.tolist())
        return np.fromiter((row not in self.excluded for row in rows), dtype=bool, count=len(candidates))

    def _one_flips(self, points: np.ndarray) -> np.ndarray:
        """Every point that differs from one of ``points`` in exactly one coordinate."""
        rows = []
        for j, n in enumerate(self.n_choices.tolist()):
            for shift in range(1, n):
                moved = points.copy()
                moved[:, j] = (moved[:, j] + shift) % n
                rows.append(moved)
        return np.vstack(rows) if rows else points[:0]

    def _two_flips(self, rng: np.random.RandomState, points: np.ndarray, n: int) -> np.ndarray:
        """``n`` random points that differ from a random one of ``points`` in two coordinates."""
        if self.dim < 2:
            return points[:0]
        base = points[rng.randint(len(points), size=n)].copy()
        first = rng.randint(self.dim, size=n)
        second = (first + 1 + rng.randint(self.dim - 1, size=n)) % self.dim
        for dims in (first, second):
            shift = 1 + (rng.random_sample(n) * (self.n_choices[dims] - 1)).astype(np.int64)
            base[np.arange(n), dims] = (base[np.arange(n), dims] + shift) % self.n_choices[dims]
        return base


# -- BayesianOptimization -----------------------------------------------------------------------


class BayesianOptimization:
    """Bayesian optimisation over the choice indices of ``pbounds``; maximises the target.

    Register evaluated points in :attr:`space` (``space.register(params, target)``, with
    ``constraints=`` when there are any), then call :meth:`suggest` for the next point. The target
    and each constraint get their own :class:`~._gp_kernel.DiscreteGP`; their hyperparameters are
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
        self._random_state = _as_rng(random_seed)
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
        self, pending: np.ndarray | None = None, exclude: Iterable[Config] = ()
    ) -> dict[str, int]:
        """Suggest the most promising point that is neither registered nor excluded.

        Args:
            pending: ``(m, dim)`` points being evaluated elsewhere: the models believe their own
                prediction there (kriging believer), which steers the suggestion away from them.
            exclude: Further points never to suggest (failed ones, say); registered and pending
                points are never suggested either.

        Raises:
            ValueError: If every point is registered, pending or excluded.
        """
        space = self._space
        pending = np.empty((0, space.dim), np.int64) if pending is None else np.asarray(pending)
        excluded = set(exclude) | set(space._cache) | {tuple(p) for p in pending.tolist()}
        if space.empty:
            return space.array_to_params(self._random_unseen(excluded))

        target = _warp(space.target, centre=float(np.median(space.target)))
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
            gp.fit(self._space.params, _warp(values, centre=0.0)).with_pending(pending)
            for gp, values in zip(self._constraint_gps, constraints.T)
        ]

    def _anchors(self, target: np.ndarray, k: int = 5) -> np.ndarray:
        """The ``k`` best points: feasible ones by target, then the least infeasible."""
        space = self._space
        if space.constraints is None:
            order = np.argsort(-target)
        else:
            # Warped, so that constraints of different units weigh alike.
            warped = np.column_stack([_warp(c, centre=0.0) for c in space.constraints.T])
            violation = np.sum(np.maximum(warped, 0.0), axis=1)
            order = np.lexsort((-target, violation))
        return space.params[order[:k]]

    def _random_unseen(self, excluded: set[Config]) -> np.ndarray:
        for _ in range(1000):
            x = self._space.random_sample()
            if tuple(x.tolist()) not in excluded:
                return x
        raise ValueError("No unexcluded point found by random sampling.")


def _finite(values: np.ndarray) -> np.ndarray:
    """``values`` with infinities replaced by the finite extremes (or +-1 when there are none)."""
    finite = values[np.isfinite(values)]
    high = float(np.max(finite)) if len(finite) else 1.0
    low = float(np.min(finite)) if len(finite) else -1.0
    return np.nan_to_num(values, nan=high, posinf=max(high, 0.0) + 1.0, neginf=min(low, 0.0) - 1.0)


def _warp(values: np.ndarray, centre: float) -> np.ndarray:
    """A monotone map that keeps ``centre`` in place and compresses heavy tails.

    Quantization results are heavy-tailed (one fp32 fallback too few can cost tens of percent of
    accuracy); a GP on the raw values spends its variance on those outliers. The signed
    logarithm ``sign(u) * log1p(|u|)`` of the values scaled by their median distance to
    ``centre`` keeps the order and the sign relative to ``centre``, which is all that expected
    improvement and the probability of feasibility (``centre = 0``) look at.
    """
    values = _finite(np.asarray(values, dtype=float))
    scale = float(np.median(np.abs(values - centre)))
    u = (values - centre) / (scale if scale > 1e-12 else 1.0)
    return np.sign(u) * np.log1p(np.abs(u))


# -- DiscreteGPSampler --------------------------------------------------------------------------

_CLAIM_KEY = "discrete_gp:claim"
# Choices per trial before one that other workers also claimed is kept all the same.
_CLAIM_ATTEMPTS = 8


class DiscreteGPSampler(BaseSampler):
    """Gaussian-process Bayesian optimisation for studies of categorical, integer and stepped-float
    parameters.

    Each trial's parameters are sampled jointly (relative sampling) over the search space shared
    by the study's trials:

    - the first ``n_startup_trials`` trials are random configurations;
    - then the objective value and, when trials carry constraints (``trial.set_constraint``,
      feasible when ``<= 0``), each constraint get their own GP with an additive plus Hamming
      kernel on the discrete space (:class:`~._gp_kernel.DiscreteGP`), and the next configuration
      maximises expected improvement over the best feasible value times the probability of
      feasibility, or the probability of feasibility alone while no trial is feasible;
    - a configuration already evaluated, failed, pruned or running is never suggested while
      others remain. Running trials also enter the models (kriging believer), and each choice is
      claimed in the trial's system attributes and checked against concurrent claims, so that
      parallel workers sharing a storage do not evaluate the same configuration. Two workers
      that claim the same configuration at once both choose again; after two such clashes a
      trial draws an unseen configuration at random, seeded by its number, since workers with
      the same data (and seed) would otherwise keep choosing alike.

    Parameters outside the shared search space are sampled at random. Failed and pruned trials are
    not modelled (their outcome says little about the value) but are never repeated. The search
    space is known once any trial has recorded its parameters; workers that start their first
    trials together before that sample them independently and may coincide (optuna-quant's
    studies evaluate the default configuration first, which settles it).

    Example:
        >>> import optuna
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> def objective(trial):
        ...     x = trial.suggest_int("x", 0, 9)
        ...     mode = trial.suggest_categorical("mode", ["a", "b", "c"])
        ...     return (x - 6) ** 2 + (mode != "b")
        >>> study = optuna.create_study(sampler=DiscreteGPSampler(seed=0))
        >>> study.optimize(objective, n_trials=15)
        >>> study.best_value <= 1
        True

    Args:
        seed: Seed of the random number generator.
        n_startup_trials: Random trials before the models take over. One: after a single
            trial the acquisition already prefers configurations far from it (the GP's own
            uncertainty explores), and every random trial is one not spent on the feasible
            region. Over 200 tuning seeds one start-up trial reached the targets in fewer trials
            than two on three of the four benchmark tables (and one more on the fourth); two beat
            four and eight before.
        n_candidates: Random candidates scored per trial when the space is larger than that
            (smaller spaces are scored in full). Past ``candidate_budget / n_candidates``
            completed trials, fewer: ``candidate_budget / n`` with ``n`` completed trials.
        candidate_budget: Bounds the cost of scoring the candidates, which grows with the
            number of trials (see :class:`BayesianOptimization`).
        n_local_search: Coordinate searches on the acquisition per trial.

    Raises:
        ValueError: When a parameter is a float without a step (the space must be finite).
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        n_startup_trials: int = 1,
        n_candidates: int = 4096,
        candidate_budget: int = 100_000,
        n_local_search: int = 3,
    ) -> None:
        self._rng = np.random.RandomState(seed)
        self._n_startup_trials = n_startup_trials
        self._n_candidates = n_candidates
        self._candidate_budget = candidate_budget
        self._n_local_search = n_local_search
        self._intersection = IntersectionSearchSpace()
        self._spaces = SpaceCache()
        self._optimizer: BayesianOptimization | None = None
        self._optimizer_key: tuple[Any, ...] | None = None

    def reseed_rng(self) -> None:
        self._rng.seed()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        """The parameters shared by every completed trial (by every trial with parameters while
        none has completed, so that the first workers of a study already avoid each other)."""
        space = self._intersection.calculate(study)
        if not space:
            space = _shared_distributions(
                t
                for t in study._get_trials(deepcopy=False, use_cache=True)
                if t.number != trial.number
            )
        return {name: d for name, d in sorted(space.items()) if not d.single()}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        self._raise_error_if_multi_objective(study)
        if not search_space:
            return {}
        trials = [t for t in study._get_trials(deepcopy=False, use_cache=True) if t.number != trial.number]
        space, history = self._spaces.history(study, trials, search_space)
        claimed = _claimed_configs(trials, space)
        seen = history.seen | set(claimed)
        if len(seen) >= space.size:
            return {}  # Every configuration has been tried: a repeat is unavoidable.
        pending = np.vstack([history.running, np.array(claimed, np.int64).reshape(-1, space.dim)])
        # Their configurations are in ``seen``, so no choice can clash with them.
        settled = {t.number for t in trials if t.state.is_finished()}
        for attempt in range(_CLAIM_ATTEMPTS):
            if attempt < 2:
                config = self._choose(study, space, history, pending, seen)
            else:
                # Workers with the same data (and often the same seed) make the same choices, so
                # a clash repeats: after two, part ways at random, drawn per trial number.
                rng = np.random.RandomState([trial.number, attempt])
                config = space.random_unseen(rng, seen)
            if not _claim_is_contested(study, trial, space, config, settled):
                break
            seen.add(config)
            pending = np.vstack([pending, np.array(config)[None, :]])
        return space.decode(config)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        choices = choices_of(param_name, param_distribution)
        return choices[self._rng.randint(len(choices))]

    def _choose(
        self,
        study: Study,
        space: DiscreteSpace,
        history: History,
        pending: np.ndarray,
        seen: set[Config],
    ) -> Config:
        if len(history.values) < self._n_startup_trials:
            return space.random_unseen(self._rng, seen)
        optimizer = self._optimizer_for(study, space, history)
        for config, value, row in zip(
            history.configs.tolist(),
            history.values,
            [None] * len(history.values) if history.constraints is None else history.constraints,
        ):
            if config not in optimizer.space:
                # Optuna minimises by default, INC maximises: History's values are lower-better.
                optimizer.space.register(config, -value, row)
        try:
            params = optimizer.suggest(pending=pending, exclude=seen)
        except ValueError:
            return space.random_unseen(self._rng, seen)
        return tuple(params[name] for name in space.names)

    def _optimizer_for(
        self, study: Study, space: DiscreteSpace, history: History
    ) -> BayesianOptimization:
        # Kept across trials of one study and space, so that the GPs warm-start their fits.
        n_constraints = 0 if history.constraints is None else history.constraints.shape[1]
        key = (id(study._storage), study._study_id, space.names, space.choices, n_constraints)
        if self._optimizer is None or self._optimizer_key != key:
            ordinal = [
                name
                for name, d in space.distributions.items()
                if isinstance(d, (IntDistribution, FloatDistribution))
            ]
            self._optimizer = BayesianOptimization(
                {name: (0, int(n)) for name, n in zip(space.names, space.n_choices)},
                random_seed=self._rng,
                ordinal=ordinal,
                n_warmup=self._n_candidates,
                n_iter=self._n_local_search,
                candidate_budget=self._candidate_budget,
            )
            self._optimizer_key = key
        return self._optimizer


def _shared_distributions(trials: Iterable[FrozenTrial]) -> dict[str, BaseDistribution]:
    """The distributions that every trial with parameters has in common."""
    shared: dict[str, BaseDistribution] | None = None
    for t in trials:
        if not t.distributions:
            continue
        if shared is None:
            shared = dict(t.distributions)
        else:
            shared = {k: d for k, d in shared.items() if t.distributions.get(k) == d}
    return shared or {}


def _claimed_configs(trials: Sequence[FrozenTrial], space: DiscreteSpace) -> list[Config]:
    """Configurations claimed by running trials that have not set all their parameters yet."""
    claimed = []
    for t in trials:
        running = t.state in (TrialState.RUNNING, TrialState.WAITING)
        if not running or _CLAIM_KEY not in t.system_attrs:
            continue
        if space.encode(t.params) is not None:
            continue  # Its parameters are set: History already counts it.
        config = space.encode(json.loads(t.system_attrs[_CLAIM_KEY]))
        if config is not None:
            claimed.append(config)
    return claimed


def _claim_is_contested(
    study: Study, trial: FrozenTrial, space: DiscreteSpace, config: Config, settled: set[int]
) -> bool:
    """Claim ``config`` for ``trial``; whether another trial has claimed or used it meanwhile.

    Writing the claim before reading the others' means that of two workers choosing the same
    configuration at the same time, at least one sees the other and chooses again. Trials in
    ``settled`` (finished before the choice, so known to differ) are not checked.
    """
    study._storage.set_trial_system_attr(
        trial._trial_id, _CLAIM_KEY, json.dumps(space.decode(config))
    )
    for other in study._storage.get_all_trials(study._study_id, deepcopy=False):
        if other.number == trial.number or other.number in settled:
            continue
        if space.encode(other.params) == config:
            return True
        claim = other.system_attrs.get(_CLAIM_KEY)
        if claim is not None and other.state in (TrialState.RUNNING, TrialState.WAITING):
            if space.encode(json.loads(claim)) == config:
                return True
    return False
