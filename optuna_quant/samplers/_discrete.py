"""The finite search space that both samplers of this package work on, and the study's history on it.

A configuration is a tuple of choice indices, one per parameter (sorted by name). Both samplers
keep every configuration that was completed, failed, pruned or is still running in a set, so that
they never propose one again while unseen configurations remain; the set also refuses every
configuration that differs from a seen one only in parameters its choices make inactive, and
every one that holds a forbidden combination of choices (:class:`Excluded`).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
import math
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution
from optuna.study import Study
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant._optuna_private import study_identity


Config = tuple[int, ...]

# Enumerating more configurations than this costs more memory than it saves over sampling.
_ENUMERATION_LIMIT = 200_000
# Uniform draws tried before the space is listed to find an unseen configuration.
_RANDOM_TRIES = 64


def grid_size(distribution: BaseDistribution) -> int | None:
    """How many values ``distribution`` allows; ``None`` for a float without a step.

    Example:
        >>> from optuna.distributions import FloatDistribution, IntDistribution
        >>> grid_size(IntDistribution(1, 9, step=2)), grid_size(FloatDistribution(0.0, 1.0))
        (5, None)
    """
    if isinstance(distribution, CategoricalDistribution):
        return len(distribution.choices)
    if isinstance(distribution, FloatDistribution) and distribution.step is None:
        return None
    step = 1 if distribution.log else distribution.step  # type: ignore[attr-defined]
    return round((distribution.high - distribution.low) / step) + 1  # type: ignore[attr-defined]


def choices_of(name: str, distribution: BaseDistribution) -> tuple[Any, ...]:
    """The finite list of values that ``distribution`` allows.

    Raises:
        ValueError: For a float parameter without a step, which has no finite list of values.
    """
    n = grid_size(distribution)
    if n is None:
        raise ValueError(
            f"Parameter {name!r} has the continuous distribution {distribution!r}: the samplers "
            "of optuna-quant need a finite space (categorical, integer, or float with a step)."
        )
    if isinstance(distribution, CategoricalDistribution):
        return tuple(distribution.choices)
    step = 1 if distribution.log else distribution.step  # type: ignore[attr-defined]
    low = distribution.low  # type: ignore[attr-defined]
    if isinstance(distribution, IntDistribution):
        return tuple(low + i * step for i in range(n))
    return tuple(float(low + i * step) for i in range(n))


def index_grid(n_choices: Sequence[int] | np.ndarray) -> np.ndarray:
    """Every index vector ``0 <= x < n_choices`` as rows of an array, the first index slowest.

    Example:
        >>> index_grid([2, 2]).tolist()
        [[0, 0], [0, 1], [1, 0], [1, 1]]
    """
    grids = np.meshgrid(*[np.arange(n) for n in n_choices], indexing="ij")
    return np.stack([g.ravel() for g in grids], axis=1)


class DiscreteSpace:
    """A product of finite choice lists, with configurations as index tuples.

    Args:
        search_space: Optuna distributions by parameter name.

    Example:
        >>> from optuna.distributions import CategoricalDistribution, IntDistribution
        >>> space = DiscreteSpace({"b": CategoricalDistribution(["x", "y"]), "a": IntDistribution(0, 2)})
        >>> space.names, space.size
        (('a', 'b'), 6)
        >>> space.decode((2, 1))
        {'a': 2, 'b': 'y'}
    """

    def __init__(self, search_space: Mapping[str, BaseDistribution]) -> None:
        self.names: tuple[str, ...] = tuple(sorted(search_space))
        self.distributions = {name: search_space[name] for name in self.names}
        self.choices: tuple[tuple[Any, ...], ...] = tuple(
            choices_of(name, search_space[name]) for name in self.names
        )
        self.n_choices = np.array([len(c) for c in self.choices], dtype=np.int64)
        self._index = [
            {_key(value): i for i, value in enumerate(choices)} for choices in self.choices
        ]

    @property
    def dim(self) -> int:
        """The number of parameters."""
        return len(self.names)

    @property
    def size(self) -> int:
        """The number of configurations (an exact integer, however large)."""
        return math.prod(int(n) for n in self.n_choices)

    def encode(self, params: Mapping[str, Any]) -> Config | None:
        """The index tuple of ``params``, or ``None`` when a value lies outside the space."""
        indices = []
        for name, index in zip(self.names, self._index):
            if name not in params:
                return None
            i = index.get(_key(params[name]))
            if i is None:
                return None
            indices.append(i)
        return tuple(indices)

    def encode_choices(self, choices: Mapping[str, Any]) -> dict[int, int] | None:
        """The choice index of each of ``choices`` by parameter position, or ``None`` when one lies
        outside the space (no configuration of it holds them all).

        Example:
            >>> space = DiscreteSpace({"a": CategoricalDistribution(["x", "y"]), "b": CategoricalDistribution([0, 1])})
            >>> space.encode_choices({"b": 1}), space.encode_choices({"c": 1})
            ({1: 1}, None)
        """
        encoded = {}
        for name, value in choices.items():
            if name not in self.names:
                return None
            position = self.names.index(name)
            index = self._index[position].get(_key(value))
            if index is None:
                return None
            encoded[position] = index
        return encoded

    def encode_inactive(self, inactive: Mapping[str, Mapping[Any, Iterable[str]]]) -> list[Inactive]:
        """The rules of ``inactive`` (``{param: {choice: [params it makes inactive]}}``) by
        position, leaving out parameters and choices outside the space.

        Example:
            >>> space = DiscreteSpace({"a": CategoricalDistribution(["x", "y"]), "b": CategoricalDistribution([0, 1])})
            >>> space.encode_inactive({"a": {"y": ["b", "c"], "z": ["b"]}})
            [(0, 1, (1,))]
        """
        rules = []
        for name, by_choice in inactive.items():
            if name not in self.names:
                continue
            position = self.names.index(name)
            for choice, params in by_choice.items():
                index = self._index[position].get(_key(choice))
                ignored = tuple(self.names.index(p) for p in params if p in self.names and p != name)
                if index is not None and ignored:
                    rules.append((position, index, ignored))
        return rules

    def decode(self, config: Sequence[int]) -> dict[str, Any]:
        """The parameter values of an index tuple."""
        return {
            name: choices[int(i)] for name, choices, i in zip(self.names, self.choices, config)
        }

    def enumerable(self) -> bool:
        """Whether every configuration can be listed cheaply."""
        return self.size <= _ENUMERATION_LIMIT

    def all_configs(self) -> np.ndarray:
        """Every configuration as rows of an ``(size, dim)`` index array (first index slowest)."""
        return index_grid(self.n_choices)

    def random_configs(self, rng: np.random.RandomState, n: int) -> np.ndarray:
        """``n`` uniformly random configurations (duplicates possible) as an ``(n, dim)`` array."""
        return (rng.random_sample((n, self.dim)) * self.n_choices).astype(np.int64)

    def random_unseen(self, rng: np.random.RandomState, seen: set[Config]) -> Config:
        """A uniformly random configuration not in ``seen``; any one when none is left.

        Rejection sampling is cheap while most of the space is unseen; listing it is the fallback.
        """
        configs = self.random_configs(rng, _RANDOM_TRIES if seen else 1)
        for row in configs.tolist():
            if tuple(row) not in seen:
                return tuple(row)
        unseen = self.unseen(rng, seen, 1)
        # Only sampling a huge, nearly exhausted space can come back empty: a repeat beats failing.
        return tuple((unseen[0] if len(unseen) else configs[0]).tolist())

    def unseen(
        self, rng: np.random.RandomState, seen: set[Config], n: int | None = None
    ) -> np.ndarray:
        """Up to ``n`` distinct configurations not in ``seen`` (all of them when ``n`` is None).

        An enumerable space is listed in full; a larger one is sampled, which cannot run out of
        unseen configurations in practice.
        """
        if self.enumerable():
            configs = self.all_configs()
            if seen:
                mask = np.array([tuple(row) not in seen for row in configs.tolist()])
                configs = configs[mask]
            if n is not None and len(configs) > n:
                configs = configs[rng.choice(len(configs), size=n, replace=False)]
            return configs
        want = 1024 if n is None else n
        found: dict[Config, None] = {}
        for _ in range(20):
            for row in self.random_configs(rng, 2 * want).tolist():
                config = tuple(row)
                if config not in seen:
                    found.setdefault(config)
            if len(found) >= want:
                break
        return np.array(list(found)[:want], dtype=np.int64).reshape(-1, self.dim)


Inactive = tuple[int, int, tuple[int, ...]]
"""A parameter's position, one of its choice indices, and the positions of the parameters that
this choice makes inactive (:meth:`DiscreteSpace.encode_inactive`)."""


class Excluded(set):
    """Configurations not to propose: those in the set, those equal to one of them where they
    differ only in parameters made inactive (``inactive``), and every one that holds all the
    choices of one of ``combinations`` (choice index by parameter position,
    :meth:`DiscreteSpace.encode_choices`).

    Membership is all the samplers ask, so the forbidden ones are never listed; ``len`` counts the
    set alone. Union, in-place union, ``add`` and copy keep the combinations and the rules.

    Example:
        >>> excluded = Excluded({(0, 0)}, [{1: 1}])
        >>> [(0, 0) in excluded, (1, 0) in excluded, (1, 1) in excluded, (0, 1) in excluded | {(1, 0)}]
        [True, False, True, True]
        >>> same = Excluded({(1, 0, 0)}, inactive=[(0, 1, (2,))])  # choice 1 of the first makes the third inactive
        >>> [(1, 0, 1) in same, (0, 0, 1) in same, (1, 1, 1) in same]
        [True, False, False]
    """

    def __init__(
        self,
        configs: Iterable[Config] = (),
        combinations: Iterable[Mapping[int, int]] = (),
        inactive: Iterable[Inactive] = (),
    ) -> None:
        super().__init__(configs)
        self.combinations = tuple(dict(c) for c in combinations)
        self.inactive = tuple(inactive)
        self._classes = {self.canonical(c) for c in self} if self.inactive else set()

    def canonical(self, config: Config) -> Config:
        """``config`` with every parameter that its choices make inactive at its first choice."""
        held = [ignored for position, choice, ignored in self.inactive if config[position] == choice]
        if not held:
            return config
        canonical = list(config)
        for ignored in held:
            for j in ignored:
                canonical[j] = 0
        return tuple(canonical)

    def __contains__(self, config: object) -> bool:
        if set.__contains__(self, config):
            return True
        if self.inactive and self.canonical(config) in self._classes:  # type: ignore[arg-type]
            return True
        return any(all(config[j] == i for j, i in c.items()) for c in self.combinations)  # type: ignore[index]

    def add(self, config: Config) -> None:
        set.add(self, config)
        if self.inactive:
            self._classes.add(self.canonical(config))

    def update(self, *others: Iterable[Config]) -> None:
        for other in others:
            for config in other:
                self.add(config)

    def __ior__(self, other: Iterable[Config]) -> Excluded:  # type: ignore[override,misc]
        self.update(other)
        return self

    def __or__(self, other: Iterable[Config]) -> Excluded:  # type: ignore[override]
        return Excluded(set.__or__(self, set(other)), self.combinations, self.inactive)

    def copy(self) -> Excluded:
        return Excluded(self, self.combinations, self.inactive)


def _key(value: Any) -> Any:
    # Floats from storage may differ from the distribution's choices in the last bits.
    if isinstance(value, float):
        return round(value, 12)
    return value


def constraint_matrix(rows: Sequence[Mapping[str, float]]) -> np.ndarray | None:
    """Constraint values as an ``(n, k)`` array over every key seen, or ``None`` when none was.

    A trial without a constraint that others carry counts as infinitely violating it.
    """
    keys = sorted({key for row in rows for key in row})
    if not keys:
        return None
    return np.array([[row.get(key, math.inf) for key in keys] for row in rows], dtype=float).reshape(
        len(rows), len(keys)
    )


def pareto_scores(values: np.ndarray) -> np.ndarray:
    """One lower-better score per row of ``(n, k)`` lower-better objective values.

    The integer part is the row's non-domination rank (0 on the Pareto front, 1 on the front
    once the first is removed, ...), the fraction its mean rank over the objectives divided by
    ``n``, which orders the rows within a front by how good they are on average. Splitting by
    this score splits by non-domination rank, as Optuna's multi-objective TPE does first.

    Example:
        >>> pareto_scores(np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 3.0], [2.0, 1.0]])).round(3).tolist()
        [0.25, 1.25, 2.75, 0.25]
    """
    n = len(values)
    ranks = np.full(n, -1)
    remaining = np.arange(n)
    front = 0
    while remaining.size:
        v = values[remaining]
        # Row i is dominated when some row is no worse everywhere and better somewhere.
        no_worse = np.all(v[None, :, :] <= v[:, None, :], axis=2)
        better = np.any(v[None, :, :] < v[:, None, :], axis=2)
        dominated = np.any(no_worse & better, axis=1)
        ranks[remaining[~dominated]] = front
        remaining = remaining[dominated]
        front += 1
    per_objective = np.argsort(np.argsort(values, axis=0, kind="stable"), axis=0, kind="stable")
    return ranks + per_objective.mean(axis=1) / max(n, 1)


@dataclass
class History:
    """What a sampler knows of a study on a :class:`DiscreteSpace`.

    Attributes:
        configs: Completed configurations, ``(n, dim)`` indices.
        values: Their objective values, turned so that lower is better. With several
            objectives, one score per trial (:func:`pareto_scores`): its non-domination rank,
            ties broken by its mean rank over the objectives.
        constraints: Their constraint values, ``(n, k)`` (feasible when all are <= 0), or ``None``
            when the study records no constraints.
        running: Configurations of running or waiting trials, ``(m, dim)``.
        seen: Every configuration completed, failed, pruned or running.
    """

    configs: np.ndarray
    values: np.ndarray
    constraints: np.ndarray | None
    running: np.ndarray
    seen: set[Config]

    @classmethod
    def collect(
        cls,
        study: Study,
        trials: Iterable[FrozenTrial],
        encode: Callable[[FrozenTrial], Sequence[float] | None],
        dim: int,
        dtype: type = np.int64,
    ) -> History:
        """The history of the trials that ``encode`` maps to a point (``None`` leaves one out).

        Trials are left out where their parameters lie outside the space. A pruned trial that
        reported a value counts with it (Optuna's ``tell`` keeps its last report). Constraints are read
        from ``trial.constraints`` (``trial.set_constraint``); a completed trial without them, in
        a study where others have them, counts as infeasible. :meth:`SpaceCache.history` encodes
        choice indices; a sampler on a continuous space can pass Optuna's internal values
        instead, whose ``seen`` set is then of no use.

        Example:
            >>> import optuna
            >>> study = optuna.create_study()
            >>> study.add_trial(optuna.trial.create_trial(params={"x": 1.5}, value=2.0,
            ...     distributions={"x": optuna.distributions.FloatDistribution(0, 2)}))
            >>> history = History.collect(study, study.trials, lambda t: [t.params["x"]], 1, float)
            >>> history.configs.tolist(), history.values.tolist()
            ([[1.5]], [2.0])
        """
        signs = [-1.0 if d == StudyDirection.MAXIMIZE else 1.0 for d in study.directions]
        configs: list[tuple] = []
        values: list[list[float]] = []
        constraint_rows: list[dict[str, float]] = []
        running: list[tuple] = []
        seen: set[tuple] = set()
        for trial in trials:
            point = encode(trial)
            if point is None:
                continue
            config = tuple(point)
            # A pruned trial with a value (its last intermediate one) measured its configuration
            # in part: an observation, as Optuna's samplers take it.
            if trial.state in (TrialState.COMPLETE, TrialState.PRUNED) and trial.values is not None:
                configs.append(config)
                values.append([sign * float(v) for sign, v in zip(signs, trial.values)])
                constraint_rows.append(dict(trial.constraints))
                seen.add(config)
            elif trial.state in (TrialState.RUNNING, TrialState.WAITING):
                running.append(config)
                seen.add(config)
            elif trial.state in (TrialState.FAIL, TrialState.PRUNED):
                seen.add(config)
        value_matrix = np.array(values, dtype=float).reshape(-1, len(signs))
        return cls(
            configs=np.array(configs, dtype=dtype).reshape(-1, dim),
            values=value_matrix[:, 0] if len(signs) == 1 else pareto_scores(value_matrix),
            constraints=constraint_matrix(constraint_rows),
            running=np.array(running, dtype=dtype).reshape(-1, dim),
            seen=seen,
        )


class SpaceCache:
    """Each search space a sampler meets, built once, with a memo of its encoded finished trials.

    A sampler is asked for every trial of a study; building the :class:`DiscreteSpace` and
    encoding every trial again each time would cost more than the model in a long study.

    Example:
        >>> import optuna
        >>> study = optuna.create_study()
        >>> cache = SpaceCache()
        >>> space, history = cache.history(study, [], {"a": CategoricalDistribution(["x", "y"])})
        >>> cache.history(study, [], {"a": CategoricalDistribution(["x", "y"])})[0] is space
        True
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], tuple[Any, DiscreteSpace, dict[int, Config | None]]] = {}

    def history(
        self, study: Study, trials: Iterable[FrozenTrial], search_space: Mapping[str, BaseDistribution]
    ) -> tuple[DiscreteSpace, History]:
        """The space of ``search_space`` and the history of ``trials`` on it."""
        # Trial numbers are unique within a study, study ids within a storage; holding the storage
        # keeps id(storage) from passing to another one.
        storage, study_id = study_identity(study)
        key = (id(storage), study_id, tuple(sorted(search_space)))
        cached = self._entries.get(key)
        if cached is None or cached[1].distributions != dict(search_space):
            cached = (storage, DiscreteSpace(search_space), {})
            self._entries[key] = cached
        _, space, encoded = cached

        def encode(trial: FrozenTrial) -> Config | None:
            # A finished trial's parameters never change: each is encoded once per space.
            if trial.number in encoded:
                return encoded[trial.number]
            config = space.encode(trial.params)
            if trial.state.is_finished():
                encoded[trial.number] = config
            return config

        return space, History.collect(study, trials, encode, space.dim, np.int64)

    def __getstate__(self) -> dict[str, Any]:
        # The entries hold storages, which need not pickle; they are rebuilt on demand.
        return {"_entries": {}}


def rank_order(values: np.ndarray, constraints: np.ndarray | None) -> np.ndarray:
    """Indices of the observations, best first.

    Feasible observations rank first, by value (lower is better); infeasible ones follow, by their
    total violation, as in Optuna's TPE. Each constraint's violation counts in units of its
    typical size, the median of its absolute values over the observations: quantization's
    accuracy constraint lives in hundredths and its latency one in tenths, and a raw sum would
    let latency alone decide which infeasible trials are better (the benchmark in
    ``docs/benchmarks.md`` measured the difference).

    Example:
        >>> rank_order(np.array([3.0, 1.0, 2.0, 0.5]), np.array([[0.0], [0.0], [-1.0], [2.0]])).tolist()
        [1, 2, 0, 3]
    """
    if constraints is None:
        return np.argsort(values, kind="stable")
    feasible = np.all(constraints <= 0, axis=1)
    violation = (np.maximum(constraints, 0) / _typical_sizes(constraints)).sum(axis=1)
    return np.lexsort((np.where(feasible, values, violation), ~feasible))


def _typical_sizes(constraints: np.ndarray) -> np.ndarray:
    """The median absolute value of each constraint column; 1 where it is 0 or unknown."""
    sizes = np.ones(constraints.shape[1])
    for j, column in enumerate(constraints.T):
        magnitudes = np.abs(column[np.isfinite(column)])
        if magnitudes.size and np.median(magnitudes) > 0:
            sizes[j] = np.median(magnitudes)
    return sizes
