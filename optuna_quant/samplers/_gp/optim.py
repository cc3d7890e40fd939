"""INC's ``acq_max``: the maximum of an acquisition function over the discrete points of a space."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
import math

import numpy as np

from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._discrete import index_grid
from optuna_quant.samplers._gp.acqf import Model
from optuna_quant.samplers._gp.target_space import as_rng
from optuna_quant.samplers._gp.target_space import RandomSeed


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
        >>> from optuna_quant.samplers._gp.gp import DiscreteGP
        >>> gp = DiscreteGP([2, 3]).fit(np.array([[0, 0], [1, 2]]), np.array([0.0, 1.0]))
        >>> from optuna_quant.samplers._gp.acqf import ExpectedImprovement
        >>> x = acq_max(ExpectedImprovement(), gp, 1.0, np.array([[0, 2], [0, 3]]), 0,
        ...             exclude={(0, 0), (1, 2)})
        >>> tuple(x.tolist()) not in {(0, 0), (1, 2)}
        True
    """
    rng = as_rng(random_seed)
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

