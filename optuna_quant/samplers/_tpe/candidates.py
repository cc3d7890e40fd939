"""Which drawn candidate TPE proposes: the highest ``l(x) / g(x)``, unseen under the never-repeat rule.

Candidates are drawn from ``l`` in batches (:func:`draw_batches`). While the rule holds, a batch
whose candidates were all seen is followed by another, up to ``_DRAW_ROUNDS`` of them; the sampler
then falls back to a random unseen configuration.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
import heapq

import numpy as np

from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._tpe.parzen_estimator import MultivariateParzen
from optuna_quant.samplers._tpe.parzen_estimator import UnivariateParzen
from optuna_quant.samplers._tpe.probability_distributions import Dim
from optuna_quant.samplers._tpe.search_space import indices_of
from optuna_quant.samplers._tpe.search_space import values_of


# Candidate batches drawn, all of them seen, before a random unseen configuration is taken.
_DRAW_ROUNDS = 4

Batch = tuple[np.ndarray, np.ndarray]
"""Drawn candidates, ``(n, d)``, and their ``log l(x) - log g(x)``: ``(n,)`` from joint models,
``(n, d)`` from one model per parameter."""


def draw_batches(
    rng: np.random.RandomState,
    below: MultivariateParzen | UnivariateParzen,
    above: MultivariateParzen | UnivariateParzen,
    n_candidates: int,
) -> Iterator[Batch]:
    """Batches of ``n_candidates`` draws from ``below`` (``l``), scored against ``above`` (``g``)."""
    for _ in range(_DRAW_ROUNDS):
        candidates = below.sample(rng, n_candidates)
        yield candidates, below.log_pdf(candidates) - above.log_pdf(candidates)


def best_joint(
    batches: Iterable[Batch], dims: Sequence[Dim], seen: set[Config] | None
) -> np.ndarray | None:
    """The drawn candidate with the highest ``l(x) / g(x)``, the best unseen one under ``seen``."""
    for candidates, log_ratio in batches:
        order = np.argsort(-log_ratio, kind="stable")
        if seen is None:
            return candidates[order[0]]
        configs = indices_of(candidates, dims)
        for i in order:
            if tuple(configs[i].tolist()) not in seen:
                return candidates[i]
    return None


def best_per_parameter(
    batches: Iterable[Batch], dims: Sequence[Dim], seen: set[Config] | None
) -> np.ndarray | None:
    """Each parameter's candidate with the highest ``l / g`` (hyperopt's rule).

    Under ``seen``, the combinations of the drawn values are visited best-first by their summed
    log ratio (the joint ratio of independent models) until an unseen one turns up.
    """
    scores: list[dict[int, float]] = [{} for _ in dims]
    for candidates, log_ratio in batches:
        if seen is None:
            best = np.argmax(log_ratio, axis=0)
            return candidates[best, np.arange(len(dims))]
        configs = indices_of(candidates, dims)
        for j, by_index in enumerate(scores):
            by_index.update(zip(configs[:, j].tolist(), log_ratio[:, j].tolist()))
        config = best_unseen_combination(scores, seen)
        if config is not None:
            return values_of(np.array([config]), dims)[0]
    return None


def best_unseen_combination(
    scores: Sequence[Mapping[int, float]], seen: set[Config]
) -> Config | None:
    """The unseen combination of one index per parameter with the highest summed score.

    Best-first search over the product of the per-parameter lists sorted by score: each
    combination is reached once, by raising ranks in parameter order only, and the search stops
    at the first unseen combination, after at most ``len(seen) + 1`` steps.

    Example:
        >>> best_unseen_combination([{0: 1.0, 1: 0.0}, {0: 0.0, 1: 0.5}], seen={(0, 1)})
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
