"""A prior over a finite space: per-parameter, per-choice scores of how likely a choice is good.

A prior is a mapping ``{param_name: {choice: score}}`` with scores in ``[0, 1)``. The samplers know
nothing of where it comes from (optuna-quant derives it from measured per-layer sensitivities and
from the choices that failed); parameters and choices it leaves out score 0.5, no opinion. Within
one parameter the scores, normalised to sum to one, are the prior probabilities of its choices,
and a configuration's prior probability is the product over its parameters. A score of 0 means
never: the samplers draw from the space without that choice (:func:`allowed_space`).

The trials can contradict a prior: its favourite choices of a parameter do worse than the ones it
scored low. :meth:`SpacePrior.following` then flattens that parameter's prior toward uniform, as
far as the evidence goes (:func:`prior_trust`), so that a wrong prior costs a few trials, not the
study.
"""

from __future__ import annotations

from collections.abc import Mapping
import copy
import math
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from scipy.stats import spearmanr

from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._discrete import DiscreteSpace


Prior = Mapping[str, Mapping[Any, float]]
NEUTRAL = 0.5
MIN_EVIDENCE = 4
"""Completed trials before the evidence can contradict a prior."""
FADED_AT = 1.0
"""The contradiction, in standard errors of a rank correlation, at which a prior is flat. 1 and
2 were tried on the three tuning tables (docs/benchmarks.md): the same with the measured prior,
1 the better with a mirrored (wrong) one."""


def validate_prior(prior: Prior | None) -> dict[str, dict[Any, float]] | None:
    """A copy of ``prior``, checked: a mapping of mappings with scores in [0, 1) (0: never).

    Raises:
        TypeError: If ``prior`` or one of its entries is not a mapping.
        ValueError: If a score is not a number in [0, 1).

    Example:
        >>> validate_prior({"layer:conv": {"fp32": 0.8, "int8": 0.2}})
        {'layer:conv': {'fp32': 0.8, 'int8': 0.2}}
        >>> validate_prior({"layer:conv": {"fp32": 1.0}})
        Traceback (most recent call last):
        ...
        ValueError: Prior score of choice 'fp32' of parameter 'layer:conv' must lie in [0, 1) (0: never), got 1.0.
    """
    if prior is None:
        return None
    if not isinstance(prior, Mapping):
        raise TypeError(f"A prior maps parameter names to {{choice: score}}, got {type(prior).__name__}.")
    checked: dict[str, dict[Any, float]] = {}
    for name, scores in prior.items():
        if not isinstance(scores, Mapping):
            raise TypeError(f"Prior of parameter {name!r} must map choices to scores, got {scores!r}.")
        for choice, score in scores.items():
            if not isinstance(score, (int, float)) or not 0.0 <= float(score) < 1.0 or math.isnan(score):
                raise ValueError(
                    f"Prior score of choice {choice!r} of parameter {name!r} must lie in [0, 1) "
                    f"(0: never), got {score!r}."
                )
        checked[str(name)] = {choice: float(score) for choice, score in scores.items()}
    return checked


def allowed_space(
    prior: Prior | None, search_space: Mapping[str, BaseDistribution]
) -> dict[str, BaseDistribution]:
    """``search_space`` without the categorical choices that ``prior`` scores 0: what is drawn from.

    Raises:
        ValueError: If the prior scores every choice of a parameter 0.

    Example:
        >>> space = {"mode": CategoricalDistribution(["a", "b", "c"])}
        >>> allowed_space({"mode": {"b": 0.0, "c": 0.7}}, space)["mode"].choices
        ('a', 'c')
    """
    allowed = dict(search_space)
    for name, scores in (prior or {}).items():
        distribution = search_space.get(name)
        never = {choice for choice, score in scores.items() if score == 0.0}
        if not never or not isinstance(distribution, CategoricalDistribution):
            continue
        kept = [choice for choice in distribution.choices if choice not in never]
        if not kept:
            raise ValueError(f"The prior scores every choice of parameter {name!r} 0: nothing is left to draw.")
        allowed[name] = CategoricalDistribution(kept)
    return allowed


def choice_probabilities(prior: Prior | None, name: str, choices: tuple[Any, ...]) -> np.ndarray | None:
    """The prior probabilities of ``choices`` of parameter ``name``; ``None`` when it has no prior.

    Example:
        >>> choice_probabilities({"a": {"x": 0.9}}, "a", ("x", "y")).tolist()
        [0.6428571428571429, 0.35714285714285715]
    """
    if prior is None or name not in prior:
        return None
    scores = np.array([prior[name].get(choice, NEUTRAL) for choice in choices], dtype=float)
    return scores / scores.sum()


def prior_trust(probs: list[np.ndarray], configs: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Per parameter, how far the completed trials leave its prior standing, in [0, 1].

    The rank correlation ``rho`` between the prior probability of each trial's choice and how
    well the trial did (``order``: trial indices, best first), counted in standard errors
    (``rho * sqrt(n - 1)``): 1 while it is not negative, falling linearly to 0 at
    :data:`FADED_AT` standard errors against the prior (its favourites miss, or a choice it
    scored low pays). 1 before :data:`MIN_EVIDENCE` trials, and for a parameter whose trials
    all took choices of one probability (nothing to compare).

    Example:
        >>> probs = [np.array([0.9, 0.1]), np.array([0.5, 0.5])]
        >>> configs = np.array([[1, 0], [1, 1], [0, 0], [0, 1], [0, 0]])   # choice 1 of the first does best
        >>> prior_trust(probs, configs, order=np.arange(5)).round(2).tolist()
        [0.0, 1.0]
    """
    n = len(order)
    trust = np.ones(len(probs))
    if n < MIN_EVIDENCE:
        return trust
    goodness = np.empty(n)
    goodness[order] = np.arange(n, 0, -1)
    for j, p in enumerate(probs):
        favoured = p[configs[:, j]]
        if np.ptp(favoured) == 0:
            continue
        rho = float(spearmanr(favoured, goodness).statistic)
        trust[j] = float(np.clip(1.0 + rho * np.sqrt(n - 1) / FADED_AT, 0.0, 1.0))
    return trust


class SpacePrior:
    """A prior on the configurations of a :class:`~._discrete.DiscreteSpace`.

    Args:
        space: The space.
        prior: The per-parameter, per-choice scores (validated).

    Example:
        >>> from optuna.distributions import CategoricalDistribution
        >>> space = DiscreteSpace({"a": CategoricalDistribution(["x", "y"]),
        ...                        "b": CategoricalDistribution([0, 1, 2])})
        >>> space_prior = SpacePrior(space, {"a": {"x": 0.8, "y": 0.2}})
        >>> np.exp(space_prior.log_prob(np.array([[0, 2], [1, 2]]))).round(4).tolist()
        [0.2667, 0.0667]
    """

    def __init__(self, space: DiscreteSpace, prior: Prior) -> None:
        probs = [choice_probabilities(prior, name, choices) for name, choices in zip(space.names, space.choices)]
        self._space = space
        self._use([np.full(len(c), 1.0 / len(c)) if p is None else p for p, c in zip(probs, space.choices)])

    def _use(self, probs: list[np.ndarray]) -> None:
        self.probs = probs
        self._log_probs = [np.log(p) for p in probs]

    def following(self, configs: np.ndarray, order: np.ndarray) -> SpacePrior:
        """This prior with each parameter's probabilities raised to its :func:`prior_trust` in
        the completed ``configs`` (``order``: best first) and normalised: flatter where they
        contradict it."""
        trust = prior_trust(self.probs, np.asarray(configs, dtype=np.int64).reshape(-1, self._space.dim), order)
        tempered = copy.copy(self)
        tempered._use([p**t / np.sum(p**t) for p, t in zip(self.probs, trust)])
        return tempered

    def log_prob(self, configs: np.ndarray) -> np.ndarray:
        """The log prior probability of each row of ``(m, dim)`` choice indices."""
        configs = np.asarray(configs, dtype=np.int64).reshape(-1, self._space.dim)
        total = np.zeros(len(configs))
        for j, log_p in enumerate(self._log_probs):
            total += log_p[configs[:, j]]
        return total

    def sample_unseen(self, rng: np.random.RandomState, seen: set[Config], tries: int = 64) -> Config:
        """A draw from the prior that is not in ``seen``; uniformly unseen when draws keep hitting it."""
        for _ in range(tries):
            config = tuple(int(rng.choice(len(p), p=p)) for p in self.probs)
            if config not in seen:
                return config
        return self._space.random_unseen(rng, seen)

