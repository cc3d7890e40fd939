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
import itertools

import numpy as np

from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._discrete import Inactive
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
    at the first unseen combination, after at most ``len(seen) + 1`` steps. Where ``seen`` holds
    rules of inactive parameters (:class:`~optuna_quant.samplers._discrete.Excluded`), the
    product is searched by region of the rules' choices, with the inactive parameters at their
    best-scored index: a seen configuration then stands for one combination of its region, and
    the bound holds.

    Example:
        >>> best_unseen_combination([{0: 1.0, 1: 0.0}, {0: 0.0, 1: 0.5}], seen={(0, 1)})
        (0, 0)
    """
    found = [_best_first(region, seen) for region in _regions(scores, getattr(seen, "inactive", ()))]
    return max(
        (config for config in found if config is not None),
        key=lambda config: sum(s[i] for s, i in zip(scores, config)),
        default=None,
    )


def _regions(
    scores: Sequence[Mapping[int, float]], inactive: Sequence[Inactive]
) -> Iterator[list[Mapping[int, float]]]:
    """``scores`` split by each rule's choice (held, or any other drawn index), with the
    parameters that the held choices make inactive restricted to their best-scored index."""
    triggers: dict[int, dict[int, tuple[int, ...]]] = {}
    for position, choice, ignored in inactive:
        if choice in scores[position]:
            rules = triggers.setdefault(position, {})
            rules[choice] = rules.get(choice, ()) + ignored
    options = [[*((c,) for c in rules), tuple(set(scores[p]) - set(rules))] for p, rules in triggers.items()]
    for picks in itertools.product(*options):
        region = list(scores)
        ignored_positions: set[int] = set()
        for position, pick in zip(triggers, picks):
            region[position] = {i: scores[position][i] for i in pick}
            if len(pick) == 1 and pick[0] in triggers[position]:
                ignored_positions.update(triggers[position][pick[0]])
        if any(not r for r in region):
            continue
        for j in ignored_positions - set(triggers):
            top = max(scores[j], key=scores[j].__getitem__)
            region[j] = {top: scores[j][top]}
        yield region


def _best_first(scores: Sequence[Mapping[int, float]], seen: set[Config]) -> Config | None:
    """The unseen combination of ``scores`` with the highest summed score, best first."""
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
