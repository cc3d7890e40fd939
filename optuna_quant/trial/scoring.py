"""The prior over the choices, from the measured sensitivity: what samplers get as ``set_prior``.

:func:`choice_scores` scores each choice of the other parameters by its all-int8 output error
and, where that is within the accuracy target, the speed of its kernels
(:func:`combination_scores`), and each layer's ``fp32``/``int8`` by what its revert buys against
what it costs, alone or together with an adjacent layer it interacts with
(:func:`interacting_pairs`), what a revert buys counted in accuracy targets
(:func:`targets_per_error`); :func:`revert_order` orders the layers for the start-up trials that
put them back to fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
import math
from typing import Any

import numpy as np

from optuna_quant.measure.interactions import PairRecovery
from optuna_quant.measure.sensitivity import LayerSensitivity
from optuna_quant.measure.sensitivity import lowest_error
from optuna_quant.measure.sensitivity import ScopeError
from optuna_quant.trial.space import LAYER_PREFIX


SCORE_RANGE = (0.1, 0.9)
"""The lowest and highest score of a choice of the other parameters: a prior, never a verdict."""
LAYER_SCORE_RANGE = (0.05, 0.95)
"""The lowest and highest score of a layer's choice."""
MATERIAL_BENEFIT = 0.02
"""What a revert must buy (accuracy in targets, or speed as a share of the speed-up) to matter:
one that buys half this has a third of the odds its gain and cost alone would give. Chosen by
leaving one table out (docs/benchmarks.md, "Leave one table out"): 0.05 before."""
REVERT_RESOLUTION = 0.06
"""The share of the speed-up within which one revert's end-to-end timing cannot tell a cost from a
saving on a loaded machine: a small layer's revert measures as free either way. Chosen by leaving
one table out, as :data:`MATERIAL_BENEFIT`: 0.03 before."""
WHOLE_MODEL_SPREAD = 0.03
"""The spread taken for one short timing of a whole model (:func:`speed_odds`). Leaving one table
out cannot choose it: it acts where the reference meets the accuracy target, which no table's does."""
INTERACTION_SHARE = 0.5
"""A pair interacts when more than this share of what its joint revert recovers is recovered by
neither single revert, and that is worth at least :data:`MATERIAL_BENEFIT` of the accuracy target."""


def _saving(s: LayerSensitivity) -> float:
    return s.time_saved_ms if s.revert_cost is None else s.revert_cost


def _harm_key(s: LayerSensitivity) -> tuple[int, float]:
    # A layer that int8 does not speed up has nothing to trade its accuracy cost against: first.
    saving = _saving(s)
    if saving <= 0:
        return (0, -s.acc_cost)
    return (1, -s.acc_cost / saving)


def revert_order(sens: Mapping[str, LayerSensitivity]) -> list[str]:
    """Layers in the order start-up trials should put them back to fp32: most harm per time saved first.

    The time a layer's int8 saves is its :attr:`~LayerSensitivity.revert_cost` where measured,
    else its profiled :attr:`~LayerSensitivity.time_saved_ms`. Layers that int8 does not speed
    up come first (by accuracy cost), then the others by ``acc_cost / saving``, highest first.

    Example:
        >>> sens = {
        ...     "a": LayerSensitivity(0.01, 0.01, 1.0, 0.5),   # 0.02 per ms
        ...     "b": LayerSensitivity(0.10, 0.10, 1.0, 0.8),   # 0.5 per ms
        ...     "c": LayerSensitivity(0.00, 0.00, 0.1, 0.2),   # slower in int8
        ... }
        >>> revert_order(sens)
        ['c', 'b', 'a']
    """
    return sorted(sens, key=lambda n: _harm_key(sens[n]))


def targets_per_error(
    sens: Mapping[str, LayerSensitivity],
    *,
    acc_loss: float,
    accuracy_target: float,
    scope_errors: Sequence[ScopeError] = (),
) -> float:
    """What removing a unit of output error at the combination ``sens`` was measured at buys, in
    accuracy targets.

    The all-int8 accuracy loss is shared out over the layers as their output error is: ``acc_loss``
    (with ``scope_errors``, predicted at :func:`base_combination`, where the layers are measured,
    by the ratio of its error to the reference's, the first entry) over the summed
    ``error_alone`` (standing for the all-int8 error, as the errors add up), in units of
    ``accuracy_target``; nothing when that loss is negative.

    Example:
        >>> sens = {"a": LayerSensitivity(0.03, 0.03, 1, 1), "b": LayerSensitivity(0.01, 0.0, 1, 1)}
        >>> round(targets_per_error(sens, acc_loss=0.02, accuracy_target=0.01), 6)   # 0.04 of error: 2 targets
        50.0
    """
    if scope_errors:
        acc_loss = base_loss(scope_errors, acc_loss=acc_loss, accuracy_target=accuracy_target)
    total = sum(max(s.error_alone, 0.0) for s in sens.values())
    # A configuration that loses nothing leaves no accuracy to buy back.
    return max(acc_loss, 0.0) / total / accuracy_target if total > 0 else 0.0


def interacting_pairs(
    sens: Mapping[str, LayerSensitivity],
    pairs: Sequence[PairRecovery],
    *,
    acc_loss: float,
    accuracy_target: float,
    scope_errors: Sequence[ScopeError] = (),
) -> list[PairRecovery]:
    """The ``pairs`` whose joint revert recovers mostly what neither single revert does
    (:data:`INTERACTION_SHARE`), the largest interaction first.

    What the pair recovers beyond its two single reverts must also matter: at least
    :data:`MATERIAL_BENEFIT` of the accuracy target, counted as :func:`choice_scores` counts a
    revert's gain (:func:`targets_per_error`; the arguments are its). A pair whose interaction is
    all of what it recovers, but a negligible share of the error, is no reason to revert two layers.

    Example:
        >>> sens = {"a": LayerSensitivity(0.01, -0.009, 1, 1), "b": LayerSensitivity(0.1, 0.01, 1, 1)}
        >>> [p.layers for p in interacting_pairs(sens, [PairRecovery(("a", "b"), 0.11)], acc_loss=0.05, accuracy_target=0.01)]
        [('a', 'b')]
        >>> interacting_pairs(sens, [PairRecovery(("a", "b"), 0.015)], acc_loss=0.05, accuracy_target=0.01)   # b's own revert explains it
        []
        >>> interacting_pairs(sens, [PairRecovery(("a", "b"), 0.11)], acc_loss=0.0002, accuracy_target=0.01)  # 0.02 of a target
        []
    """
    worth = targets_per_error(sens, acc_loss=acc_loss, accuracy_target=accuracy_target, scope_errors=scope_errors)
    found = [
        p
        for p in pairs
        if p.error_recovered > 0
        and p.interaction(sens) > INTERACTION_SHARE * p.error_recovered
        and worth * p.interaction(sens) >= MATERIAL_BENEFIT
    ]
    return sorted(found, key=lambda p: -p.interaction(sens))


def layer_scores(gain: float, cost: float, may_save: float = 0.0) -> dict[str, float]:
    """Scores of ``fp32`` and ``int8`` for a layer whose revert to fp32 buys ``gain`` and costs ``cost``.

    ``gain``: the accuracy loss it saves, in accuracy targets; ``cost``: the share of the
    speed-up it loses (negative when the revert is faster); ``may_save``: speed it may buy that
    its timing could not resolve (:func:`unresolved_saving`). The odds of fp32 are
    ``exp(4 (gain - cost))``, discounted by ``benefit / (benefit + MATERIAL_BENEFIT)`` where
    ``benefit`` is what the revert buys (``gain``, plus the speed when it is faster, plus
    ``may_save``); fp32 scores
    those odds as a probability within :data:`LAYER_SCORE_RANGE`, int8 the rest. Reverting is
    likely good when it buys more accuracy than it costs speed, and unlikely when it buys nothing:
    on a model of many layers, each of which costs little speed, the layers that do not matter
    stay int8 instead of being drawn half the time.

    Example:
        >>> layer_scores(0.5, 0.25)
        {'fp32': 0.7233, 'int8': 0.2767}
        >>> layer_scores(0.0, 0.02)   # buys nothing: int8
        {'fp32': 0.05, 'int8': 0.95}
        >>> layer_scores(0.0, 0.005, may_save=0.025)   # timed as free, and its int8 kernel is slower
        {'fp32': 0.3526, 'int8': 0.6474}
    """
    benefit = max(gain, 0.0) + max(-cost, 0.0) + may_save
    odds = np.exp(4.0 * (gain - cost)) * benefit / (benefit + MATERIAL_BENEFIT)
    fp32 = float(np.clip(odds / (1.0 + odds), *LAYER_SCORE_RANGE))
    return {"fp32": round(fp32, 4), "int8": round(1.0 - fp32, 4)}


def unresolved_saving(s: LayerSensitivity) -> float:
    """Speed a layer's revert may buy that its timing could not resolve: where its int8 kernel
    profiles slower than its fp32 one and the revert timed within :data:`REVERT_RESOLUTION` of
    free, what is left of that resolution beyond the timed cost or saving (a timed saving is
    counted by :func:`layer_scores` already); else nothing.

    Without it a small layer whose int8 is slower scores int8 as surely as one that buys nothing
    (silero_vad's output convolution: docs/benchmarks.md, "A prior that cannot hurt much").

    Example:
        >>> round(unresolved_saving(LayerSensitivity(0.0, 0.0, fp32_ms=0.02, int8_ms=0.04, revert_cost=0.005)), 4)
        0.055
        >>> unresolved_saving(LayerSensitivity(0.0, 0.0, fp32_ms=0.04, int8_ms=0.02, revert_cost=0.005))  # int8 faster
        0.0
    """
    if s.revert_cost is not None and s.time_saved_ms < 0 and abs(s.revert_cost) < REVERT_RESOLUTION:
        return REVERT_RESOLUTION - abs(s.revert_cost)
    return 0.0


def ranks_kernels(acc_loss: float | None, accuracy_target: float | None) -> bool:
    """Whether the prior ranks the kernels' speed: where the reference's ``acc_loss`` meets the
    ``accuracy_target`` (:func:`combination_scores`), so that a study need time them only then.

    Example:
        >>> ranks_kernels(0.004, 0.01), ranks_kernels(0.03, 0.01), ranks_kernels(None, 0.01)
        (True, False, False)
    """
    return acc_loss is not None and accuracy_target is not None and acc_loss <= accuracy_target


def speed_odds(lat_diffs: Sequence[float | None], within: Sequence[bool] | None = None) -> list[float]:
    """How likely each all-int8 speed-up of ``lat_diffs`` is as fast as the fastest of those
    ``within`` (default: all), as a share of that one's own chance; at most 1.

    A timing is taken to spread by :data:`WHOLE_MODEL_SPREAD` of the fastest (normal). Relative,
    not against the latency target: timed in the same rounds, the sets' differences hold from
    one measurement to the next better than their level does (mtcnn_rnet's all-int8 model read
    0.92 and 1.05 in two measurements; docs/benchmarks.md). An untimed entry (``None``) gets the
    slowest timed one's odds; nothing timed leaves every odds at 1.

    Example:
        >>> [round(odds, 2) for odds in speed_odds([1.04, 1.07])]   # about 3 % slower: a spread
        [0.35, 1.0]
        >>> [round(odds, 2) for odds in speed_odds([2.0, 1.0, None])]   # not timed: no better than the slowest
        [1.0, 0.0, 0.0]
        >>> [round(odds, 2) for odds in speed_odds([1.04, 1.07], within=[True, False])]   # faster: no better
        [1.0, 1.0]
        >>> speed_odds([None, None])
        [1.0, 1.0]
    """
    timed = [lat for lat in lat_diffs if lat is not None]
    candidates = [lat for lat, held in zip(lat_diffs, within or [True] * len(lat_diffs)) if held and lat is not None]
    if not candidates:
        return [1.0] * len(lat_diffs)
    fastest = max(candidates)

    def odds(lat: float) -> float:
        return min(1.0, math.erfc((fastest - lat) / (WHOLE_MODEL_SPREAD * fastest * math.sqrt(2.0))))

    slowest = min(odds(lat) for lat in timed)
    return [slowest if lat is None else odds(lat) for lat in lat_diffs]


def combination_scores(
    scope_errors: Sequence[ScopeError],
    *,
    acc_loss: float | None = None,
    accuracy_target: float | None = None,
) -> list[float | None]:
    """How each measured combination of the other parameters rates as the place of the targets,
    the best 1; ``None`` for a failed one.

    Where the reference (the first entry) misses the ``accuracy_target`` with its ``acc_loss``
    (fractions), or either is not given, the lowest error leads: a combination rates
    ``lowest error / its error``. Predicted otherwise, the sampler tables' few feasible choices
    tied with many infeasible ones (docs/benchmarks.md); and what the all-int8 kernels' speed
    is worth there depends on the reverts that the accuracy needs, which can slow a faster
    combination down more (mlp: per-tensor weights run 30 % faster all-int8, and every
    configuration that meets both targets is per channel).

    Where the reference meets the target, a combination rates ``target / its predicted loss``,
    the loss predicted as ``acc_loss`` times its error over the reference's, and 1 where that
    meets the target, times its kernels' speed (:func:`speed_odds` of its ``lat_diff`` against
    the fastest of those predicted to meet it): error matters only where it would miss the
    target, and the kernels' speed decides among the rest.

    Example:
        >>> errors = [{"params": {"g": "c"}, "error": 0.01, "lat_diff": 1.0},
        ...           {"params": {"g": "t"}, "error": 0.02, "lat_diff": 1.06}]
        >>> [round(score, 3) for score in combination_scores(errors)]   # no target: the error alone
        [1.0, 0.5]
        >>> [round(score, 3) for score in combination_scores(errors, acc_loss=0.004, accuracy_target=0.01)]
        [0.059, 1.0]
        >>> [round(score, 3) for score in combination_scores(errors, acc_loss=0.008, accuracy_target=0.01)]
        [1.0, 0.625]
    """
    lowest = lowest_error(scope_errors)["error"]
    reference = scope_errors[0]["error"] or 0.0  # None: the reference's build failed here
    measured = [entry for entry in scope_errors if entry["error"] is not None]
    if not ranks_kernels(acc_loss, accuracy_target) or reference <= 0:
        rated = [lowest / entry["error"] if entry["error"] > 0 else 1.0 for entry in measured]
    else:
        assert acc_loss is not None and accuracy_target is not None  # ranks_kernels said so
        predicted = [max(acc_loss, 0.0) * entry["error"] / reference for entry in measured]
        accuracy = [accuracy_target / loss if loss > accuracy_target else 1.0 for loss in predicted]
        odds = speed_odds([entry.get("lat_diff") for entry in measured], [part == 1.0 for part in accuracy])
        rated = [part * speed for part, speed in zip(accuracy, odds)]
    top = max(rated)
    scores = iter(rated)
    return [None if entry["error"] is None else next(scores) / top for entry in scope_errors]


def base_combination(
    scope_errors: Sequence[ScopeError],
    *,
    acc_loss: float | None = None,
    accuracy_target: float | None = None,
) -> ScopeError:
    """The measured combination that :func:`combination_scores` (same arguments) rates highest,
    the lowest error among equals: where the layers are measured and the start-up trials start.

    Without targets it is the lowest-error one.

    Raises:
        ValueError: If every combination failed.
    """
    values = combination_scores(scope_errors, acc_loss=acc_loss, accuracy_target=accuracy_target)
    rated = [(value, -entry["error"], i) for i, (entry, value) in enumerate(zip(scope_errors, values)) if value is not None]
    return scope_errors[max(rated)[2]]


def base_loss(scope_errors: Sequence[ScopeError], *, acc_loss: float, accuracy_target: float) -> float:
    """The all-int8 loss predicted at :func:`base_combination` (same arguments): the reference's
    ``acc_loss`` times the base's output error over the reference's (the first entry), or
    ``acc_loss`` where the reference's error is none or 0.

    Example:
        >>> errors = [{"params": {"g": "t"}, "error": 0.04}, {"params": {"g": "c"}, "error": 0.01}]
        >>> base_loss(errors, acc_loss=0.02, accuracy_target=0.01)
        0.005
    """
    reference = scope_errors[0]["error"] or 0.0
    base = base_combination(scope_errors, acc_loss=acc_loss, accuracy_target=accuracy_target)
    return acc_loss * base["error"] / reference if reference > 0 else acc_loss


def scope_scores(
    scope_errors: Sequence[ScopeError],
    *,
    acc_loss: float | None = None,
    accuracy_target: float | None = None,
) -> dict[str, dict[Any, float]]:
    """Scores of the choices of the other parameters: each choice the best
    :func:`combination_scores` (same arguments) of a combination that holds it, within
    :data:`SCORE_RANGE`.

    The choices that quantize with the least error lead, and among those that the accuracy target
    allows the fastest kernels; one ten times worse is unlikely.

    Example:
        >>> errors = [{"params": {"g": "c"}, "error": 0.01}, {"params": {"g": "t"}, "error": 0.04}]
        >>> scope_scores(errors)
        {'g': {'c': 0.9, 't': 0.25}}
        >>> scope_scores(errors, acc_loss=0.002, accuracy_target=0.01)  # t's 0.008: within it too
        {'g': {'c': 0.9, 't': 0.9}}
        >>> scope_scores(errors, acc_loss=0.004, accuracy_target=0.01)  # t's 0.016 misses it
        {'g': {'c': 0.9, 't': 0.625}}
    """
    values = combination_scores(scope_errors, acc_loss=acc_loss, accuracy_target=accuracy_target)
    best: dict[str, dict[Any, float]] = {}
    for entry, value in zip(scope_errors, values):
        if value is None:
            continue  # failed: a choice that fails alone is forbidden apart (trial/failures.py)
        for name, choice in entry["params"].items():
            by_choice = best.setdefault(name, {})
            by_choice[choice] = max(by_choice.get(choice, 0.0), value)
    return {
        name: {choice: round(float(np.clip(value, *SCORE_RANGE)), 4) for choice, value in by_choice.items()}
        for name, by_choice in best.items()
    }


def scope_errors_within(
    scope_errors: Sequence[ScopeError], choices: Mapping[str, Sequence[Any]], fixed: Mapping[str, Any]
) -> list[ScopeError]:
    """The combinations of ``scope_errors`` that a space holds: each parameter of ``choices`` at
    one of its choices, each other one at its ``fixed`` value (left out when it has none).

    Example:
        >>> errors = [{"params": {"g": "c", "m": "a"}, "error": 0.1}, {"params": {"g": "t", "m": "a"}, "error": 0.2},
        ...           {"params": {"g": "c", "m": "s"}, "error": 0.3}]
        >>> [e["error"] for e in scope_errors_within(errors, {"g": ["c", "t"]}, {"m": "a"})]
        [0.1, 0.2]
    """

    def held(name: str, choice: Any) -> bool:
        return choice in choices[name] if name in choices else name in fixed and choice == fixed[name]

    return [entry for entry in scope_errors if all(held(name, choice) for name, choice in entry["params"].items())]


def choice_scores(
    sens: Mapping[str, LayerSensitivity],
    *,
    acc_loss: float,
    accuracy_target: float,
    scope_errors: Sequence[ScopeError] = (),
    pairs: Sequence[PairRecovery] = (),
    base_acc_loss: float | None = None,
) -> dict[str, dict[Any, float]]:
    """A prior for samplers, ``{parameter: {choice: score in (0, 1)}}``, from the measurements.

    - The other parameters (those of ``scope_errors``, named as there): :func:`scope_scores`
      with ``acc_loss`` and ``accuracy_target``.
    - Each layer (``"layer:<node>"``): :func:`layer_scores` of what reverting it buys and costs.
      The all-int8 configuration's accuracy loss is shared out over the layers as their output
      error is: reverting a layer buys its ``error_recovered`` times :func:`targets_per_error`
      (``acc_loss * error_recovered / sum(error_alone)`` in units of ``accuracy_target``;
      nothing when that loss, or the error it recovers, is negative); it costs its measured
      :attr:`~LayerSensitivity.revert_cost`, and may save what :func:`unresolved_saving` says. A layer of an interacting pair
      (:func:`interacting_pairs`) scores fp32 at least as the pair's joint revert does: what
      the two recover together, against what the two reverts cost.

    Args:
        sens: The layers' sensitivity, with ``revert_cost`` measured, at
            :func:`base_combination` of ``scope_errors`` (or at the reference when there are none).
        acc_loss: The reference's relative accuracy loss (a fraction: 0.02 for 2 %). With
            ``scope_errors``, the loss at the base combination is predicted from it, scaled by
            the ratio of the two errors (the first entry is the reference's).
        accuracy_target: The largest acceptable relative accuracy loss, as a fraction.
        scope_errors: :func:`measure_scope_errors`' result; none: layers only.
        pairs: What adjacent pairs' joint reverts recover
            (:func:`~optuna_quant.measure.interactions.measure_pairs`), at the same combination.
        base_acc_loss: The loss measured at :func:`base_combination` with every layer int8,
            which the layers then share out instead of the predicted one; the other parameters
            are still scored by the prediction from ``acc_loss``.

    Raises:
        ValueError: If ``accuracy_target`` is not positive or a layer has no ``revert_cost``.

    Example:
        >>> sens = {"a": LayerSensitivity(0.03, 0.03, 0.1, 0.05, 0.05), "b": LayerSensitivity(0.01, 0.0, 0.1, 0.05, 0.3)}
        >>> choice_scores(sens, acc_loss=0.02, accuracy_target=0.01)
        {'layer:a': {'fp32': 0.95, 'int8': 0.05}, 'layer:b': {'fp32': 0.05, 'int8': 0.95}}
    """
    if not accuracy_target > 0:
        raise ValueError(f"accuracy_target must be a positive fraction, got {accuracy_target!r}.")
    unmeasured = [node for node, s in sens.items() if s.revert_cost is None]
    if unmeasured:
        raise ValueError(f"Layers {unmeasured} have no revert_cost; measure them with revert_timing set.")
    if base_acc_loss is None:
        measured = {"acc_loss": acc_loss, "accuracy_target": accuracy_target, "scope_errors": scope_errors}
    else:
        measured = {"acc_loss": base_acc_loss, "accuracy_target": accuracy_target, "scope_errors": ()}
    scores: dict[str, dict[Any, float]] = {}
    if scope_errors:
        scores.update(scope_scores(scope_errors, acc_loss=acc_loss, accuracy_target=accuracy_target))
    worth = targets_per_error(sens, **measured)

    def gain(recovered: float) -> float:
        return worth * max(recovered, 0.0)  # a revert that adds output error (noise) buys nothing

    for node, s in sens.items():
        scores[LAYER_PREFIX + node] = layer_scores(gain(s.error_recovered), s.revert_cost, unresolved_saving(s))  # type: ignore[arg-type]
    for pair in interacting_pairs(sens, pairs, **measured):
        joint = layer_scores(gain(pair.error_recovered), sum(sens[node].revert_cost for node in pair.layers))  # type: ignore[misc]
        for node in pair.layers:
            if joint["fp32"] > scores[LAYER_PREFIX + node]["fp32"]:
                scores[LAYER_PREFIX + node] = joint
    return scores
