"""The Optuna sampler: Gaussian-process Bayesian optimisation on a finite search space."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution
from optuna.search_space import IntersectionSearchSpace
from optuna.study import Study
from optuna.trial import FrozenTrial

from optuna_quant._optuna_private import cached_trials
from optuna_quant._optuna_private import study_identity
from optuna_quant.samplers import _coordination
from optuna_quant.samplers._base import InTurnSampler
from optuna_quant.samplers._discrete import choices_of
from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._discrete import DiscreteSpace
from optuna_quant.samplers._discrete import History
from optuna_quant.samplers._discrete import rank_order
from optuna_quant.samplers._gp.bayesian_optimization import BayesianOptimization
from optuna_quant.samplers._prior import allowed_space
from optuna_quant.samplers._prior import choice_probabilities
from optuna_quant.samplers._prior import Prior
from optuna_quant.samplers._prior import SpacePrior


class DiscreteGPSampler(InTurnSampler):
    """Gaussian-process Bayesian optimisation for studies of categorical, integer and stepped-float
    parameters.

    Each trial's parameters are sampled jointly (relative sampling) over the search space shared
    by the study's trials:

    - the first ``n_startup_trials`` trials are random configurations;
    - then the objective value and, when trials carry constraints (``trial.set_constraint``,
      feasible when ``<= 0``), each constraint get their own GP with an additive plus Hamming
      kernel on the discrete space (:class:`~optuna_quant.samplers._gp.gp.DiscreteGP`), and the next configuration
      maximises expected improvement over the best feasible value times the probability of
      feasibility, or the probability of feasibility alone while no trial is feasible;
    - a configuration already evaluated, failed, pruned or running is never suggested while
      others remain. Running trials also enter the models (kriging believer). Workers sharing a
      storage never evaluate one configuration twice, whatever their seeds: each trial waits
      (briefly, bounded) for the lower-numbered running trials to choose, excludes their
      choices and claims its own (:mod:`optuna_quant.samplers._coordination`);
    - with a ``prior`` (per-parameter, per-choice scores, see :meth:`set_prior`), start-up
      configurations are drawn from it, and the acquisition is weighted by the prior
      probability raised to ``prior_strength / n`` after ``n`` completed trials (piBO, Hvarfner
      et al. 2022): the prior steers the first model-based trials and fades as data accumulate,
      and faster for a parameter whose trials contradict it
      (:meth:`~optuna_quant.samplers._prior.SpacePrior.following`);
    - a study with several objectives is modelled on one scalar, the trials' non-domination
      rank (see :class:`~optuna_quant.samplers._discrete.History`), with the constraints as
      above.

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
        prior: ``{param_name: {choice: score}}``, scores in [0, 1) saying how likely a choice is
            good (0: never drawn); parameters and choices left out score 0.5. Also settable later with
            :meth:`set_prior`.
        prior_strength: The prior's weight ``beta`` in the acquisition (see above).
        claim_wait_seconds: The most a trial waits for lower-numbered running trials to choose
            (never longer than the storage's heartbeat grace period).

    Raises:
        ValueError: When a parameter is a float without a step (the space must be finite), or
            for a negative ``prior_strength`` or ``claim_wait_seconds``, or a prior score
            outside [0, 1).
    """

    max_startup_trials: int | None = 0
    """An optuna-quant study queues no start-up trials for it: weighted by the prior, its
    acquisition tries the prior's likeliest configurations itself
    (:func:`optuna_quant.trial.guidance.startup_trials`), but for the first where the prior
    predicts that it misses the accuracy target (:func:`optuna_quant.trial.guidance.queued_params`)."""

    def __init__(
        self,
        *,
        seed: int | None = None,
        n_startup_trials: int = 1,
        n_candidates: int = 4096,
        candidate_budget: int = 100_000,
        n_local_search: int = 3,
        prior: Prior | None = None,
        prior_strength: float = 10.0,
        claim_wait_seconds: float = _coordination.DEFAULT_WAIT_SECONDS,
    ) -> None:
        if not prior_strength >= 0:
            raise ValueError(f"prior_strength must not be negative, got {prior_strength!r}.")
        super().__init__(seed, prior, claim_wait_seconds)
        self._n_startup_trials = n_startup_trials
        self._n_candidates = n_candidates
        self._candidate_budget = candidate_budget
        self._n_local_search = n_local_search
        self._prior_strength = prior_strength
        self._intersection = IntersectionSearchSpace()
        self._optimizer: BayesianOptimization | None = None
        self._optimizer_key: tuple[Any, ...] | None = None

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        """The parameters shared by every completed trial (by every trial with parameters while
        none has completed, so that the first workers of a study already avoid each other)."""
        space = self._intersection.calculate(study, use_cache=True)
        if not space:
            space = _shared_distributions(t for t in cached_trials(study) if t.number != trial.number)
        return {name: d for name, d in sorted(space.items()) if not d.single()}

    def _sample_in_turn(
        self, study: Study, trials: list[FrozenTrial], search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        space, history = self._history(study, trials, search_space)
        claimed = _coordination.claimed_configs(trials, space)
        seen = history.seen | set(claimed)
        if len(seen) >= space.size:
            return {}  # Every configuration has been tried: a repeat is unavoidable.
        pending = np.vstack([history.running, np.array(claimed, np.int64).reshape(-1, space.dim)])
        return space.decode(self._choose(study, space, history, pending, seen))

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        distribution = allowed_space(self._prior, {param_name: param_distribution})[param_name]
        choices = choices_of(param_name, distribution)
        probs = choice_probabilities(self._prior, param_name, choices)
        if probs is None:
            return choices[self._rng.randint(len(choices))]
        return choices[self._rng.choice(len(choices), p=probs)]

    def _choose(
        self,
        study: Study,
        space: DiscreteSpace,
        history: History,
        pending: np.ndarray,
        seen: set[Config],
    ) -> Config:
        if len(history.values) < self._n_startup_trials:
            return self._random_unseen(space, seen)
        space_prior = None
        if self._prior is not None:
            order = rank_order(history.values, history.constraints)
            space_prior = SpacePrior(space, self._prior).following(history.configs, order)
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
            params = optimizer.suggest(
                pending=pending,
                exclude=seen,
                log_prior=None if space_prior is None else space_prior.log_prob,
                prior_weight=self._prior_strength / max(len(history.values), 1),
            )
        except ValueError:
            return space.random_unseen(self._rng, seen)
        return tuple(params[name] for name in space.names)

    def _optimizer_for(
        self, study: Study, space: DiscreteSpace, history: History
    ) -> BayesianOptimization:
        # Kept across trials of one study and space, so that the GPs warm-start their fits.
        n_constraints = 0 if history.constraints is None else history.constraints.shape[1]
        storage, study_id = study_identity(study)
        key = (id(storage), study_id, space.names, space.choices, n_constraints)
        # Several objectives are modelled by rank, and ranks shift as trials arrive: refit from scratch.
        if self._optimizer is None or self._optimizer_key != key or len(study.directions) > 1:
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
