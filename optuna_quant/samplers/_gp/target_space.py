"""INC's ``TargetSpace``: the evaluated points of a discrete space, their targets and constraints."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from optuna_quant.samplers._discrete import Config


RandomSeed = int | np.random.RandomState | None


def as_rng(random_seed: RandomSeed) -> np.random.RandomState:
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
        self.random_state = as_rng(random_seed)
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

