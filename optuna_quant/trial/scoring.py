"""The prior over the choices, from the measured sensitivity: what samplers get as ``set_prior``.

:func:`choice_scores` scores each choice of the other parameters by its all-int8 output error and
each layer's ``fp32``/``int8`` by what its revert buys against what it costs, alone or together
with an adjacent layer it interacts with (:func:`interacting_pairs`), what a revert buys counted
in accuracy targets (:func:`targets_per_error`); :func:`revert_order` orders the layers for the
start-up trials that put them back to fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
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
MATERIAL_BENEFIT = 0.05
"""What a revert must buy (accuracy in targets, or speed as a share of the speed-up) to matter:
one that buys half this has a third of the odds its gain and cost alone would give."""
REVERT_RESOLUTION = 0.03
"""The share of the speed-up within which one revert's end-to-end timing cannot tell a cost from a
saving on a loaded machine: a small layer's revert measures as free either way."""
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
    sens: Mapping[str, LayerSensitivity], *, acc_loss: float, accuracy_target: float, scope_errors: Sequence[ScopeError] = ()
) -> float:
    """What removing a unit of output error at the combination ``sens`` was measured at buys, in
    accuracy targets.

    The all-int8 accuracy loss is shared out over the layers as their output error is: ``acc_loss``
    (with ``scope_errors``, predicted at the lowest-error combination by the ratio of its error to
    the reference's, the first entry) over the summed ``error_alone`` (standing for the all-int8
    error, as the errors add up), in units of ``accuracy_target``; nothing when that loss is negative.

    Example:
        >>> sens = {"a": LayerSensitivity(0.03, 0.03, 1, 1), "b": LayerSensitivity(0.01, 0.0, 1, 1)}
        >>> round(targets_per_error(sens, acc_loss=0.02, accuracy_target=0.01), 6)   # 0.04 of error: 2 targets
        50.0
    """
    if scope_errors:
        reference = scope_errors[0]["error"] or 0.0
        acc_loss = acc_loss * lowest_error(scope_errors)["error"] / reference if reference > 0 else acc_loss
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
        >>> interacting_pairs(sens, [PairRecovery(("a", "b"), 0.11)], acc_loss=0.0005, accuracy_target=0.01)  # 0.05 of a target
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
        {'fp32': 0.7119, 'int8': 0.2881}
        >>> layer_scores(0.0, 0.02)   # buys nothing: int8
        {'fp32': 0.05, 'int8': 0.95}
        >>> layer_scores(0.0, 0.005, may_save=0.025)   # timed as free, and its int8 kernel is slower
        {'fp32': 0.2463, 'int8': 0.7537}
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
        0.025
        >>> unresolved_saving(LayerSensitivity(0.0, 0.0, fp32_ms=0.04, int8_ms=0.02, revert_cost=0.005))  # int8 faster
        0.0
    """
    if s.revert_cost is not None and s.time_saved_ms < 0 and abs(s.revert_cost) < REVERT_RESOLUTION:
        return REVERT_RESOLUTION - abs(s.revert_cost)
    return 0.0


def scope_scores(
    scope_errors: Sequence[ScopeError], *, acc_loss: float | None = None, accuracy_target: float | None = None
) -> dict[str, dict[Any, float]]:
    """Scores of the choices of the other parameters, from the lowest all-int8 error of any
    combination with each choice, within :data:`SCORE_RANGE`.

    A choice scores ``lowest error / its error`` (failed combinations left out): the choices that
    quantize with the least error
    lead; one ten times worse is unlikely. When the reference (the first entry) meets the
    ``accuracy_target`` with its ``acc_loss`` (fractions), a choice scores ``target / its predicted
    loss`` instead, the loss predicted as ``acc_loss`` times its error over the reference's, and
    the highest where that meets the target: error then matters only where it would miss the
    target, and the choices are left to the speed (on a model whose all-int8 loss is negative,
    every choice ties). Where the reference misses the target the lowest error leads: predicted
    that way, the sampler tables' few feasible choices tied with many infeasible ones
    (docs/benchmarks.md).

    Example:
        >>> errors = [{"params": {"g": "c"}, "error": 0.01}, {"params": {"g": "t"}, "error": 0.04}]
        >>> scope_scores(errors)
        {'g': {'c': 0.9, 't': 0.25}}
        >>> scope_scores(errors, acc_loss=0.002, accuracy_target=0.01)  # t's 0.008: within it too
        {'g': {'c': 0.9, 't': 0.9}}
        >>> scope_scores(errors, acc_loss=0.004, accuracy_target=0.01)  # t's 0.016 misses it
        {'g': {'c': 0.9, 't': 0.625}}
    """
    best: dict[str, dict[Any, float]] = {}
    for entry in scope_errors:
        if entry["error"] is None:
            continue  # failed: a choice that fails alone is forbidden apart (trial/failures.py)
        for name, choice in entry["params"].items():
            by_choice = best.setdefault(name, {})
            by_choice[choice] = min(by_choice.get(choice, np.inf), entry["error"])
    lowest = lowest_error(scope_errors)["error"]
    reference = scope_errors[0]["error"] or 0.0  # None: the reference's build failed here

    def score(error: float) -> float:
        if acc_loss is None or accuracy_target is None or acc_loss > accuracy_target or reference <= 0:
            return lowest / error if error > 0 else 1.0
        predicted = max(acc_loss, 0.0) * error / reference
        return accuracy_target / predicted if predicted > accuracy_target else 1.0

    return {
        name: {choice: round(float(np.clip(score(error), *SCORE_RANGE)), 4) for choice, error in by_choice.items()}
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
        sens: The layers' sensitivity, with ``revert_cost`` measured, at the lowest-error
            combination of ``scope_errors`` (or at the reference when there are none).
        acc_loss: The reference's relative accuracy loss (a fraction: 0.02 for 2 %). With
            ``scope_errors``, the loss at the lowest-error combination is predicted from it,
            scaled by the ratio of the two errors (the first entry is the reference's).
        accuracy_target: The largest acceptable relative accuracy loss, as a fraction.
        scope_errors: :func:`measure_scope_errors`' result; none: layers only.
        pairs: What adjacent pairs' joint reverts recover
            (:func:`~optuna_quant.measure.interactions.measure_pairs`), at the same combination.

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
    scores: dict[str, dict[Any, float]] = {}
    if scope_errors:
        scores.update(scope_scores(scope_errors, acc_loss=acc_loss, accuracy_target=accuracy_target))
    worth = targets_per_error(sens, acc_loss=acc_loss, accuracy_target=accuracy_target, scope_errors=scope_errors)

    def gain(recovered: float) -> float:
        return worth * max(recovered, 0.0)  # a revert that adds output error (noise) buys nothing

    for node, s in sens.items():
        scores[LAYER_PREFIX + node] = layer_scores(gain(s.error_recovered), s.revert_cost, unresolved_saving(s))  # type: ignore[arg-type]
    for pair in interacting_pairs(sens, pairs, acc_loss=acc_loss, accuracy_target=accuracy_target, scope_errors=scope_errors):
        joint = layer_scores(gain(pair.error_recovered), sum(sens[node].revert_cost for node in pair.layers))  # type: ignore[misc]
        for node in pair.layers:
            if joint["fp32"] > scores[LAYER_PREFIX + node]["fp32"]:
                scores[LAYER_PREFIX + node] = joint
    return scores
