"""A Tree-structured Parzen Estimator sampler that never spends a trial on a repeat.

TPE (Bergstra et al. 2011, "Algorithms for Hyper-Parameter Optimization") splits the observations
into good ones (the best ``gamma``) and bad ones, fits a Parzen estimator ``l(x)`` to the good and
``g(x)`` to the bad, draws candidates from ``l`` and proposes the one with the highest ``l(x) / g(x)``.
The estimators live in :mod:`optuna_quant.samplers._tpe.parzen_estimator` and the choice among
the drawn candidates in :mod:`optuna_quant.samplers._tpe.candidates`; this module orchestrates.

On a finite space (categorical, integer, and float-with-step parameters) the sampler never proposes
a configuration that was already completed, failed, pruned or is still running while unseen ones
remain: it ranks the drawn candidates, takes the best unseen one, draws again when all drawn ones
were seen, and falls back to a random unseen configuration. OpenVINO POT instead returned the stored
result of a repeat, which spends a trial on nothing new.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
import functools
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
from optuna_quant.samplers._discrete import History
from optuna_quant.samplers._discrete import rank_order
from optuna_quant.samplers._prior import allowed_space
from optuna_quant.samplers._prior import choice_probabilities
from optuna_quant.samplers._prior import Prior
from optuna_quant.samplers._prior import SpacePrior
from optuna_quant.samplers._tpe.candidates import best_joint
from optuna_quant.samplers._tpe.candidates import best_per_parameter
from optuna_quant.samplers._tpe.candidates import draw_batches
from optuna_quant.samplers._tpe.parzen_estimator import linear_forgetting_weights
from optuna_quant.samplers._tpe.parzen_estimator import MultivariateParzen
from optuna_quant.samplers._tpe.parzen_estimator import UnivariateParzen
from optuna_quant.samplers._tpe.probability_distributions import CategoricalDim
from optuna_quant.samplers._tpe.probability_distributions import Dim
from optuna_quant.samplers._tpe.probability_distributions import dim_of
from optuna_quant.samplers._tpe.probability_distributions import sample_uniform
from optuna_quant.samplers._tpe.search_space import continuous_history
from optuna_quant.samplers._tpe.search_space import indices_of
from optuna_quant.samplers._tpe.search_space import is_finite
from optuna_quant.samplers._tpe.search_space import min_choices
from optuna_quant.samplers._tpe.search_space import values_of


# Both hyperopt and Optuna cap the good set at 25 observations.
_MAX_GOOD = 25


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
    categorical parameters' estimators, flattened for a parameter whose trials contradict it
    (:meth:`~optuna_quant.samplers._prior.SpacePrior.following`), and the distribution of the
    start-up draws. The defaults
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
        prior: Per-choice scores in [0, 1) by parameter, 0 for never
            (:mod:`optuna_quant.samplers._prior`), or later :meth:`set_prior`.
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
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        # Alone, one parameter's values repeat by design: the never-repeat rule is for whole
        # configurations.
        trials = cached_trials(study)
        search_space = allowed_space(self._prior, {param_name: param_distribution})
        return self._sample(study, trials, search_space, never_repeat=False)[param_name]

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
        if all(is_finite(dist) for dist in search_space.values()):
            space, history = self._history(study, trials, search_space)
            claimed = np.array(_coordination.claimed_configs(trials, space), np.int64)
            history.running = np.vstack([history.running, claimed.reshape(-1, space.dim)])
            history.seen |= set(map(tuple, claimed.tolist()))
            observed, running = values_of(history.configs, dims), values_of(history.running, dims)
        else:
            history = continuous_history(study, trials, names, search_space)
            observed, running = history.configs, history.running
        seen = None
        # Once every configuration was seen, repeats are unavoidable and the rule stands aside.
        if never_repeat and space is not None and len(history.seen) < space.size:
            seen = history.seen

        if len(history.values) < self._n_startup_trials:
            x = self._random(space, dims, seen)
        else:
            if space is not None and self._prior is not None:
                # The estimators' prior kernels, flatter where the trials contradict the prior.
                order = rank_order(history.values, history.constraints)
                following = SpacePrior(space, self._prior).following(history.configs, order)
                probs = {name: p for name, p in zip(space.names, following.probs) if name in self._prior}
                dims = [self._dim(name, search_space[name], probs.get(name)) for name in names]
            m = min_choices(search_space.values())
            x = self._propose(history, observed, running, dims, m, space, seen)
        if space is not None:
            return space.decode(indices_of(x[None], dims)[0])
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
        best = best_joint if self._multivariate else best_per_parameter
        x = best(draw_batches(self._rng, below, above, n_candidates), dims, seen)
        return self._random(space, dims, seen) if x is None else x

    def _dim(self, name: str, distribution: BaseDistribution, probs: np.ndarray | None = None) -> Dim:
        """The estimators' view of a parameter, with its prior (or ``probs``) where it is categorical."""
        dim = dim_of(distribution)
        if isinstance(dim, CategoricalDim):
            if probs is None:
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
            return sample_uniform(self._rng, dims)
        config = self._random_unseen(space, seen or set())
        return values_of(np.array(config)[None], dims)[0]


def split_good_bad(
    values: np.ndarray,
    constraints: np.ndarray | None,
    gamma: Callable[[int], int],
) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the good and of the bad observations, each in trial order.

    The observations are ranked by :func:`~optuna_quant.samplers._discrete.rank_order`
    (feasible first, by value; infeasible by their violation); the first ``gamma(n)`` are good.

    Example:
        >>> values = np.array([3.0, 1.0, 2.0, 0.5])
        >>> constraints = np.array([[0.0], [0.0], [-1.0], [2.0]])  # the last one is infeasible
        >>> [a.tolist() for a in split_good_bad(values, constraints, lambda n: 2)]
        [[1, 2], [0, 3]]
    """
    order = rank_order(values, constraints)
    n_good = min(gamma(len(values)), len(values))
    return np.sort(order[:n_good]), np.sort(order[n_good:])
