"""A Tree-structured Parzen Estimator sampler that never spends a trial on a repeat.

TPE (Bergstra et al. 2011, "Algorithms for Hyper-Parameter Optimization") splits the observations
into good ones (the best ``gamma``) and bad ones, fits a Parzen estimator ``l(x)`` to the good and
``g(x)`` to the bad, draws candidates from ``l`` and proposes the one with the highest ``l(x) / g(x)``.
The estimators live in :mod:`optuna_quant.samplers._tpe.parzen_estimator`; this module orchestrates.

On a finite space (categorical, integer, and float-with-step parameters) the sampler never proposes
a configuration that was already completed, failed, pruned or is still running while unseen ones
remain: it ranks the drawn candidates, takes the best unseen one, draws again when all drawn ones
were seen, and falls back to a random unseen configuration. OpenVINO POT instead returned the stored
result of a repeat, which spends a trial on nothing new.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
import functools
import heapq
import math
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.search_space import IntersectionSearchSpace
from optuna.study import Study
from optuna.trial import FrozenTrial

from optuna_quant._optuna_private import cached_trials
from optuna_quant.samplers import _coordination
from optuna_quant.samplers._base import InTurnSampler
from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._discrete import DiscreteSpace
from optuna_quant.samplers._discrete import grid_size
from optuna_quant.samplers._discrete import History
from optuna_quant.samplers._tpe.parzen_estimator import CategoricalDim
from optuna_quant.samplers._tpe.parzen_estimator import Dim
from optuna_quant.samplers._tpe.parzen_estimator import dim_of
from optuna_quant.samplers._tpe.parzen_estimator import linear_forgetting_weights
from optuna_quant.samplers._tpe.parzen_estimator import MultivariateParzen
from optuna_quant.samplers._tpe.parzen_estimator import NumericDim
from optuna_quant.samplers._tpe.parzen_estimator import UnivariateParzen
from optuna_quant.samplers._prior import choice_probabilities
from optuna_quant.samplers._prior import Prior
from optuna_quant.samplers._prior import SpacePrior

# Both hyperopt and Optuna cap the good set at 25 observations.
_MAX_GOOD = 25
# Candidate batches drawn, all of them seen, before a random unseen configuration is taken.
_DRAW_ROUNDS = 4
# Values of one numeric parameter beyond which the space is treated as continuous.
_MAX_LISTED_VALUES = 10_000


def quantile_gamma(gamma: float, n: int) -> int:
    """The number of good observations among ``n``: ``ceil(gamma * n)``, at most 25.

    Example:
        >>> quantile_gamma(0.1, 95), quantile_gamma(0.1, 1000)
        (10, 25)
    """
    return min(math.ceil(gamma * n), _MAX_GOOD)


def sqrt_gamma(gamma: float, n: int) -> int:
    """hyperopt's split: ``ceil(gamma * sqrt(n))`` good observations among ``n``, at most 25.

    Example:
        >>> sqrt_gamma(0.3, 100)  # POT's gamma=0.3 keeps only 3 of 100 as good
        3
    """
    return min(math.ceil(gamma * math.sqrt(n)), _MAX_GOOD)


class TPESampler(InTurnSampler):
    """Sampler using TPE, re-implemented, with a never-repeat rule and OpenVINO POT's preset.

    Observations are split into good and bad: with constraints (``trial.set_constraint``, feasible
    when every value is <= 0), feasible trials rank first by objective value and infeasible ones
    follow by their total violation, as in Optuna's TPE, each constraint counted in units of its
    typical size (see :func:`split_good_bad`). Running trials count as bad observations (constant
    liar), so that parallel workers spread out, and workers sharing a storage never evaluate one
    configuration twice, whatever their seeds: each trial waits (briefly, bounded) for the
    lower-numbered running trials to choose, excludes their choices and claims its own
    (:mod:`optuna_quant.samplers._coordination`). With several objectives, feasible trials rank
    by non-domination rank (see :class:`~optuna_quant.samplers._discrete.History`). A ``prior``
    (per-parameter, per-choice scores, see :meth:`set_prior`) is the prior kernel of the
    categorical parameters' estimators and the distribution of the start-up draws. The defaults
    are the settings that needed the fewest trials to reach the targets in the sampler benchmark
    (``docs/benchmarks.md``, "TPE sampler"); :meth:`pot` reproduces OpenVINO POT's use of
    hyperopt's TPE.

    Example:
        >>> import optuna
        >>> def objective(trial):
        ...     x = trial.suggest_int("x", -5, 5)
        ...     y = trial.suggest_float("y", -1.0, 1.0)
        ...     z = trial.suggest_categorical("z", ["a", "b"])
        ...     return x**2 + y**2 + (z == "b")
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> study = optuna.create_study(sampler=TPESampler(seed=1))
        >>> study.optimize(objective, n_trials=30)
        >>> study.best_params["x"], study.best_params["z"]
        (0, 'a')

    Args:
        n_startup_trials: Completed trials sampled at random before TPE starts. 10, as Optuna and
            POT; 5 and 20 did no better in the benchmark.
        n_ei_candidates: Candidates drawn from ``l(x)`` per proposal. 48: fewer trials to target
            than Optuna's 24 on four of five tuning tables. ``None``: POT's ``M``, the smallest
            number of choices of any finite parameter with more than one.
        gamma: The good share of the observations: a float ``g`` keeps the best ``ceil(g * n)``
            (at most 25); a callable maps ``n`` to the number kept, e.g.
            ``functools.partial(sqrt_gamma, 0.3)`` for hyperopt's rule. 0.1, as Optuna; 0.05,
            0.15, 0.2 and hyperopt's rule were no better across the tables.
        prior_weight: Weight of the prior in each estimator (the pseudo-count per choice of a
            categorical in the independent model). 1, as Optuna and hyperopt; 0.5, 2 and 3 won
            on some tables and lost on others. ``None``: POT's ``1 / M``.
        multivariate: Model the parameters jointly (a mixture of product kernels) instead of
            one model per parameter. Joint by default: it models interactions such as a pair of
            layers that must fall back together, and over 40 seeds it reached the targets in
            fewer trials than Optuna's TPE (median) on every benchmark table.
        constant_liar: Count running trials as bad observations.
        constraints: Split by the trials' constraints where they carry any; ``False`` splits by
            the objective value alone.
        seed: Seed of the random number generator.
        prior: Per-choice scores in (0, 1) by parameter (:mod:`optuna_quant.samplers._prior`),
            or later :meth:`set_prior`.
        claim_wait_seconds: See :func:`optuna_quant.samplers._coordination.wait_bound`.
    """

    def __init__(
        self,
        *,
        n_startup_trials: int = 10,
        n_ei_candidates: int | None = 48,
        gamma: float | Callable[[int], int] = 0.1,
        prior_weight: float | None = 1.0,
        multivariate: bool = True,
        constant_liar: bool = True,
        constraints: bool = True,
        seed: int | None = None,
        prior: Prior | None = None,
        claim_wait_seconds: float = _coordination.DEFAULT_WAIT_SECONDS,
    ) -> None:
        if n_startup_trials < 0:
            raise ValueError(f"n_startup_trials must not be negative, got {n_startup_trials!r}.")
        if n_ei_candidates is not None and n_ei_candidates < 1:
            raise ValueError(f"n_ei_candidates must be positive, got {n_ei_candidates!r}.")
        if prior_weight is not None and not prior_weight > 0:
            raise ValueError(f"prior_weight must be positive, got {prior_weight!r}.")
        if not callable(gamma) and not 0 < gamma <= 1:
            raise ValueError(f"gamma must lie in (0, 1] or be a callable, got {gamma!r}.")
        self._n_startup_trials = n_startup_trials
        self._n_ei_candidates = n_ei_candidates
        self._gamma: Callable[[int], int] = (
            gamma if callable(gamma) else functools.partial(quantile_gamma, gamma)
        )
        self._prior_weight = prior_weight
        self._multivariate = multivariate
        self._constant_liar = constant_liar
        self._constraints = constraints
        super().__init__(seed, prior, claim_wait_seconds)
        self._search_space = IntersectionSearchSpace(include_pruned=True)

    @classmethod
    def pot(cls, *, seed: int | None = None, constant_liar: bool = True) -> TPESampler:
        """OpenVINO POT's TPE: hyperopt's settings as POT chose them, plus the never-repeat rule.

        ``n_startup_trials=10``, ``gamma=0.3`` under hyperopt's square-root rule, ``M`` candidates
        and a prior weight of ``1 / M`` (``M`` the smallest number of choices of any parameter
        with more than one), one independent model per parameter. POT's TPE knew only the loss,
        so the preset splits by value and leaves constraints aside. hyperopt gives running trials
        an infinite loss, which is the constant liar.

        Example:
            >>> sampler = TPESampler.pot(seed=0)
            >>> sampler._gamma(100), sampler._n_ei_candidates, sampler._prior_weight
            (3, None, None)
        """
        return cls(
            n_startup_trials=10,
            n_ei_candidates=None,
            gamma=functools.partial(sqrt_gamma, 0.3),
            prior_weight=None,
            multivariate=False,
            constant_liar=constant_liar,
            constraints=False,
            seed=seed,
        )

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        space = self._search_space.calculate(study, use_cache=True)
        return {name: dist for name, dist in space.items() if not dist.single()}

    def _sample_in_turn(
        self, study: Study, trials: list[FrozenTrial], search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._sample(study, trials, search_space, never_repeat=True)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        # Alone, one parameter's values repeat by design: the never-repeat rule is for whole
        # configurations.
        trials = cached_trials(study)
        return self._sample(study, trials, {param_name: param_distribution}, never_repeat=False)[
            param_name
        ]

    def _sample(
        self,
        study: Study,
        trials: Sequence[FrozenTrial],
        search_space: Mapping[str, BaseDistribution],
        never_repeat: bool,
    ) -> dict[str, Any]:
        names = sorted(search_space)
        dims = [self._dim(name, search_space[name]) for name in names]
        space: DiscreteSpace | None = None
        if all(_is_finite(dist) for dist in search_space.values()):
            space, history = self._spaces.history(study, trials, search_space)
            claimed = np.array(_coordination.claimed_configs(trials, space), np.int64)
            history.running = np.vstack([history.running, claimed.reshape(-1, space.dim)])
            history.seen |= set(map(tuple, claimed.tolist()))
            observed, running = _values_of(history.configs, dims), _values_of(history.running, dims)
        else:
            history = _continuous_history(study, trials, names, search_space)
            observed, running = history.configs, history.running
        seen = None
        # Once every configuration was seen, repeats are unavoidable and the rule stands aside.
        if never_repeat and space is not None and len(history.seen) < space.size:
            seen = history.seen

        if len(history.values) < self._n_startup_trials:
            x = self._random(space, dims, seen)
        else:
            m = _min_choices(search_space.values())
            x = self._propose(history, observed, running, dims, m, space, seen)
        if space is not None:
            return space.decode(_indices_of(x[None], dims)[0])
        return {
            name: search_space[name].to_external_repr(float(v)) for name, v in zip(names, x)
        }

    def _propose(
        self,
        history: History,
        observed: np.ndarray,
        running: np.ndarray,
        dims: Sequence[Dim],
        m: int | None,
        space: DiscreteSpace | None,
        seen: set[Config] | None,
    ) -> np.ndarray:
        constraints = history.constraints if self._constraints else None
        good, bad = split_good_bad(history.values, constraints, self._gamma)
        observed_bad = observed[bad]
        if self._constant_liar:
            observed_bad = np.concatenate([observed_bad, running])
        # POT's M; a space of continuous parameters has none, and takes hyperopt's defaults.
        n_candidates = self._n_ei_candidates or (24 if m is None else m)
        prior_weight = self._prior_weight or (1.0 if m is None else 1.0 / m)
        estimator = MultivariateParzen if self._multivariate else UnivariateParzen
        below = estimator(
            observed[good], dims, linear_forgetting_weights(len(good)), prior_weight
        )
        above = estimator(
            observed_bad, dims, linear_forgetting_weights(len(observed_bad)), prior_weight
        )
        if self._multivariate:
            x = _best_joint(self._rng, below, above, n_candidates, dims, seen)
        else:
            x = _best_per_parameter(self._rng, below, above, n_candidates, dims, seen)
        return self._random(space, dims, seen) if x is None else x

    def _dim(self, name: str, distribution: BaseDistribution) -> Dim:
        """The estimators' view of a parameter, with its prior where it is categorical."""
        dim = dim_of(distribution)
        if isinstance(dim, CategoricalDim):
            probs = choice_probabilities(self._prior, name, tuple(distribution.choices))  # type: ignore[attr-defined]
            if probs is not None:
                return CategoricalDim(dim.n_choices, tuple(probs.tolist()))
        return dim

    def _random(
        self, space: DiscreteSpace | None, dims: Sequence[Dim], seen: set[Config] | None
    ) -> np.ndarray:
        """A random point, from the prior when there is one; unseen when ``seen`` is given and one
        remains."""
        if space is None:
            return _uniform(self._rng, dims)
        if self._prior is None:
            config = space.random_unseen(self._rng, seen or set())
        else:
            config = SpacePrior(space, self._prior).sample_unseen(self._rng, seen or set())
        return _values_of(np.array(config)[None], dims)[0]


def split_good_bad(
    values: np.ndarray,
    constraints: np.ndarray | None,
    gamma: Callable[[int], int],
) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the good and of the bad observations, each in trial order.

    Feasible observations rank first, by value (lower is better); infeasible ones follow, by their
    total violation, as in Optuna's TPE. The first ``gamma(n)`` are good. Each constraint's
    violation counts in units of its typical size, the median of its absolute values over the
    observations: quantization's accuracy constraint lives in hundredths and its latency one in
    tenths, and a raw sum would let latency alone decide which infeasible trials are good (the
    benchmark in ``docs/benchmarks.md`` measured the difference).

    Example:
        >>> values = np.array([3.0, 1.0, 2.0, 0.5])
        >>> constraints = np.array([[0.0], [0.0], [-1.0], [2.0]])  # the last one is infeasible
        >>> [a.tolist() for a in split_good_bad(values, constraints, lambda n: 2)]
        [[1, 2], [0, 3]]
    """
    n = len(values)
    if constraints is None:
        feasible = np.ones(n, dtype=bool)
        key = values
    else:
        feasible = np.all(constraints <= 0, axis=1)
        violation = (np.maximum(constraints, 0) / _typical_sizes(constraints)).sum(axis=1)
        key = np.where(feasible, values, violation)
    order = np.lexsort((key, ~feasible))
    n_good = min(gamma(n), n)
    return np.sort(order[:n_good]), np.sort(order[n_good:])


def _typical_sizes(constraints: np.ndarray) -> np.ndarray:
    """The median absolute value of each constraint column; 1 where it is 0 or unknown."""
    sizes = np.ones(constraints.shape[1])
    for j, column in enumerate(constraints.T):
        magnitudes = np.abs(column[np.isfinite(column)])
        if magnitudes.size and np.median(magnitudes) > 0:
            sizes[j] = np.median(magnitudes)
    return sizes


def _best_joint(
    rng: np.random.RandomState,
    below: MultivariateParzen,
    above: MultivariateParzen,
    n_candidates: int,
    dims: Sequence[Dim],
    seen: set[Config] | None,
) -> np.ndarray | None:
    """The drawn candidate with the highest ``l(x) / g(x)``, the best unseen one under ``seen``."""
    for _ in range(_DRAW_ROUNDS):
        candidates = below.sample(rng, n_candidates)
        log_ratio = below.log_pdf(candidates) - above.log_pdf(candidates)
        order = np.argsort(-log_ratio, kind="stable")
        if seen is None:
            return candidates[order[0]]
        configs = _indices_of(candidates, dims)
        for i in order:
            if tuple(configs[i].tolist()) not in seen:
                return candidates[i]
    return None


def _best_per_parameter(
    rng: np.random.RandomState,
    below: UnivariateParzen,
    above: UnivariateParzen,
    n_candidates: int,
    dims: Sequence[Dim],
    seen: set[Config] | None,
) -> np.ndarray | None:
    """Each parameter's candidate with the highest ``l / g`` (hyperopt's rule).

    Under ``seen``, the combinations of the drawn values are visited best-first by their summed
    log ratio (the joint ratio of independent models) until an unseen one turns up.
    """
    scores: list[dict[int, float]] = [{} for _ in dims]
    for _ in range(_DRAW_ROUNDS):
        candidates = below.sample(rng, n_candidates)
        log_ratio = below.log_pdf(candidates) - above.log_pdf(candidates)
        if seen is None:
            best = np.argmax(log_ratio, axis=0)
            return candidates[best, np.arange(len(dims))]
        configs = _indices_of(candidates, dims)
        for j, by_index in enumerate(scores):
            by_index.update(zip(configs[:, j].tolist(), log_ratio[:, j].tolist()))
        config = _best_unseen_combination(scores, seen)
        if config is not None:
            return _values_of(np.array([config]), dims)[0]
    return None


def _best_unseen_combination(
    scores: Sequence[Mapping[int, float]], seen: set[Config]
) -> Config | None:
    """The unseen combination of one index per parameter with the highest summed score.

    Best-first search over the product of the per-parameter lists sorted by score: each
    combination is reached once, by raising ranks in parameter order only, and the search stops
    at the first unseen combination, after at most ``len(seen) + 1`` steps.

    Example:
        >>> _best_unseen_combination([{0: 1.0, 1: 0.0}, {0: 0.0, 1: 0.5}], seen={(0, 1)})
        (0, 0)
    """
    ranked = [sorted(s.items(), key=lambda item: -item[1]) for s in scores]
    start = (0,) * len(ranked)
    heap = [(-sum(r[0][1] for r in ranked), start, 0)]
    while heap:
        neg_score, ranks, first = heapq.heappop(heap)
        config = tuple(r[k][0] for r, k in zip(ranked, ranks))
        if config not in seen:
            return config
        for j in range(first, len(ranked)):
            k = ranks[j]
            if k + 1 < len(ranked[j]):
                step = ranked[j][k][1] - ranked[j][k + 1][1]
                heapq.heappush(heap, (neg_score + step, ranks[:j] + (k + 1,) + ranks[j + 1 :], j))
    return None


def _is_finite(distribution: BaseDistribution) -> bool:
    """Whether the never-repeat rule can list the parameter's values.

    A float without a step cannot; nor, in practice, an integer range of millions, whose values
    a repeat would hardly hit anyway.
    """
    n_values = grid_size(distribution)
    return n_values is not None and n_values <= _MAX_LISTED_VALUES


def _min_choices(distributions: Iterable[BaseDistribution]) -> int | None:
    """POT's ``M``: the fewest choices of a finite parameter with more than one."""
    counts = [n for n in map(grid_size, distributions) if n is not None and n > 1]
    return min(counts) if counts else None


def _values_of(configs: np.ndarray, dims: Sequence[Dim]) -> np.ndarray:
    """Index configurations of a :class:`DiscreteSpace` as the estimators' values."""
    x = np.asarray(configs, dtype=float).reshape(-1, len(dims))
    for j, d in enumerate(dims):
        if isinstance(d, NumericDim):
            x[:, j] = d.low + x[:, j] * d.step  # type: ignore[operator]
    return x


def _indices_of(x: np.ndarray, dims: Sequence[Dim]) -> np.ndarray:
    """The estimators' values as index configurations of a :class:`DiscreteSpace`."""
    configs = np.array(x, dtype=float)
    for j, d in enumerate(dims):
        if isinstance(d, NumericDim):
            configs[:, j] = (configs[:, j] - d.low) / d.step  # type: ignore[operator]
    return np.rint(configs).astype(np.int64)


def _uniform(rng: np.random.RandomState, dims: Sequence[Dim]) -> np.ndarray:
    """One uniform draw (log-uniform for log-scaled numbers)."""
    x = np.empty(len(dims))
    for j, d in enumerate(dims):
        if isinstance(d, CategoricalDim):
            x[j] = rng.randint(d.n_choices)
        else:
            low, high = d.bounds
            x[j] = d.from_kernel(np.array([rng.uniform(low, high)]))[0]
    return x


def _continuous_history(
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
