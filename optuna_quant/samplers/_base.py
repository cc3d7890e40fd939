"""What both samplers of this package share: a seeded RNG, a prior, forbidden combinations of
choices, inactive parameters, and suggestions taken in turn."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial

from optuna_quant.samplers import _coordination
from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._discrete import DiscreteSpace
from optuna_quant.samplers._discrete import Excluded
from optuna_quant.samplers._discrete import History
from optuna_quant.samplers._discrete import SpaceCache
from optuna_quant.samplers._prior import allowed_space
from optuna_quant.samplers._prior import Prior
from optuna_quant.samplers._prior import SpacePrior
from optuna_quant.samplers._prior import validate_prior


class InTurnSampler(BaseSampler, abc.ABC):
    """A sampler whose relative suggestions follow :mod:`~optuna_quant.samplers._coordination`.

    Subclasses choose in :meth:`_sample_in_turn`, excluding what the other trials hold; this
    class waits for the lower-numbered trials first and claims the choice after.

    Args:
        seed: Seed of the random number generator.
        prior: Per-choice scores in [0, 1) by parameter, 0 for never
            (:mod:`optuna_quant.samplers._prior`).
        claim_wait_seconds: See :func:`optuna_quant.samplers._coordination.wait_bound`.

    Raises:
        ValueError: For a negative ``claim_wait_seconds``, or a prior score outside [0, 1).
        TypeError: For a prior that is not a mapping of mappings.
    """

    max_startup_trials: int | None = None
    """The most start-up trials an optuna-quant study queues for this sampler, ``None`` for as
    many as it queues (:func:`optuna_quant.trial.guidance.startup_trials`)."""

    def __init__(self, seed: int | None, prior: Prior | None, claim_wait_seconds: float) -> None:
        if not claim_wait_seconds >= 0:
            raise ValueError(f"claim_wait_seconds must not be negative, got {claim_wait_seconds!r}.")
        self._rng = np.random.RandomState(seed)
        self._spaces = SpaceCache()
        self._forbidden: list[dict[str, Any]] = []
        self._inactive: dict[str, dict[Any, tuple[str, ...]]] = {}
        self.set_prior(prior)
        self._claim_wait_seconds = claim_wait_seconds

    def reseed_rng(self) -> None:
        self._rng.seed()

    def set_prior(self, prior: Prior | None) -> None:
        """Use ``prior`` from the next trial on (``None`` removes it).

        A choice scored 0 is never drawn again: the sampler draws from the space without it.

        Raises:
            TypeError: If ``prior`` is not a mapping of mappings.
            ValueError: If a score is not in [0, 1).
        """
        self._prior = validate_prior(prior)

    def set_forbidden(self, combinations: Sequence[Mapping[str, Any]]) -> None:
        """Never draw a configuration that holds all the choices of one of ``combinations``
        (``{param: choice}`` each; one of its parameters outside the search space drops it),
        from the next trial on. ``[]`` forbids none. A study's first trial is drawn one parameter
        at a time, before the sampler knows the space, and may hold one.

        Raises:
            TypeError: If a combination is not a mapping.
        """
        for combination in combinations:
            if not isinstance(combination, Mapping):
                raise TypeError(f"A forbidden combination maps parameters to choices, got {combination!r}.")
        self._forbidden = [dict(combination) for combination in combinations]

    def set_inactive(self, inactive: Mapping[str, Mapping[Any, Sequence[str]]]) -> None:
        """Treat two configurations as one where they differ only in parameters that a choice
        of theirs makes inactive (``{param: {choice: [params it makes inactive]}}``), from the
        next trial on: once one was tried, the others are not proposed while unseen ones remain.
        Parameters and choices outside the search space are left out. ``{}`` sets none.
        Like :meth:`set_forbidden`, from a study's second trial on.

        Raises:
            TypeError: If ``inactive`` is not a mapping of mappings to lists of names.
        """
        rules: dict[str, dict[Any, tuple[str, ...]]] = {}
        for name, by_choice in inactive.items():
            lists = by_choice.values() if isinstance(by_choice, Mapping) else [None]
            if any(isinstance(params, str) or not isinstance(params, Sequence) for params in lists):
                raise TypeError(
                    f"Inactive parameters are {{param: {{choice: [param, ...]}}}}, got {name!r}: {by_choice!r}."
                )
            rules[name] = {choice: tuple(params) for choice, params in by_choice.items()}
        self._inactive = rules

    def _history(
        self, study: Study, trials: Sequence[FrozenTrial], search_space: Mapping[str, BaseDistribution]
    ) -> tuple[DiscreteSpace, History]:
        """The space of ``search_space`` and the history of ``trials`` on it, whose ``seen`` also
        refuses the forbidden combinations and the configurations equal to a seen one but for
        inactive parameters."""
        space, history = self._spaces.history(study, trials, search_space)
        if self._forbidden or self._inactive:
            encoded = [space.encode_choices(combination) for combination in self._forbidden]
            history.seen = Excluded(
                history.seen, [c for c in encoded if c is not None], space.encode_inactive(self._inactive)
            )
        return space, history

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        search_space = allowed_space(self._prior, search_space)
        return _coordination.sample_in_turn(
            study,
            trial,
            list(search_space),
            self._claim_wait_seconds,
            lambda trials: self._sample_in_turn(study, trials, search_space),
        )

    def _random_unseen(self, space: DiscreteSpace, seen: set[Config]) -> Config:
        """A random configuration not in ``seen`` (any one when none is left), drawn from the
        prior when there is one."""
        if self._prior is None:
            return space.random_unseen(self._rng, seen)
        return SpacePrior(space, self._prior).sample_unseen(self._rng, seen)

    @abc.abstractmethod
    def _sample_in_turn(
        self, study: Study, trials: list[FrozenTrial], search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """The relative parameters, given every other trial of the study; ``{}`` when every
        configuration is taken."""
