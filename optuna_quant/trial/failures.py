"""What a failing configuration teaches the study: which of its choices fail, alone or in a pair.

When a trial's configuration fails (building it, loading it or ``eval_fn`` raises), each of its
choices of the other scopes that differs from the reference is measured again alone on the
reference, without timing (:func:`culprits`): one that fails there too fails because of itself
(a calibration method, an approach, an operator-type set on this graph). When none does, the
pairs of those choices are measured the same way, up to the first that fails: the two fail
together (dynamic quantization with asymmetric weights, on a kernel that takes none, say). The
study stores what it found (:func:`optuna_quant.trial.records.forbid_choice`) so that every
worker agrees. From then on:

- optuna-quant's samplers get a choice that fails alone as a score of 0, never, in their prior,
  and never draw a configuration that holds a failing pair
  (:func:`optuna_quant.trial.guidance.set_prior`);
- a trial that another sampler gives either fails at once with the stored reason, unmeasured
  (:class:`ForbiddenChoiceError`).

A pair is measured beside the reference's other choices, and forbidden whatever they are: where
it fails only beside one of them (per-channel weights, say), the study loses its combinations
with the others too. The sensitivity measurement finds failing sets of choices before any trial
does, and exactly (:func:`failing_in_measurement`): it builds every combination of the other
scopes. A failure that neither a choice nor a pair of them explains (a layer, three choices) is a
plain failed trial, which the samplers never draw again.

Example:
    >>> found = culprits(measurer, space, {"range_estimator": "entropy", ...}, trial=3)  # doctest: +SKIP
    >>> [str(f) for f in found]                                                            # doctest: +SKIP
    ["range_estimator='entropy'"]
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
import itertools
import logging
from typing import Any

import optuna

from optuna_quant.measure.measurer import Measurer
from optuna_quant.measure.sensitivity import failure_reason
from optuna_quant.measure.sensitivity import ScopeError
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.storages.lock import StudyLock
from optuna_quant.trial import records
from optuna_quant.trial.records import ForbiddenChoice
from optuna_quant.trial.space import LAYER_PREFIX
from optuna_quant.trial.space import SearchSpace


_logger = logging.getLogger("optuna_quant")


class ForbiddenChoiceError(RuntimeError):
    """A trial drew a choice that the study learnt to fail: it fails with the stored reason."""

    def __init__(self, forbidden: ForbiddenChoice) -> None:
        found = "the sensitivity measurement" if forbidden.trial is None else f"trial {forbidden.trial}"
        super().__init__(f"{forbidden} fails on this model ({found}: {forbidden.reason}); not measured again.")
        self.forbidden = forbidden


def _singles(space: SearchSpace, params: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The choices of ``params`` outside the layer scope that change the reference's model."""
    reference = space.default_params()
    base = space.to_config(reference)
    return [
        (name, choice)
        for name, choice in params.items()
        if not name.startswith(LAYER_PREFIX)
        and choice != reference[name]
        and space.to_config({**reference, name: choice}) != base
    ]


def culprits(measurer: Measurer, space: SearchSpace, params: Mapping[str, Any], trial: int) -> list[ForbiddenChoice]:
    """The choices of ``params`` that fail alone on the reference configuration; when none does,
    the first pair of them that fails there.

    Each choice costs a build and an ``eval_fn`` run, no timing, and so does each pair (of at most
    seven scopes' choices: 21) when no choice fails alone; only failing trials pay it.

    Args:
        measurer: Builds and evaluates the configurations.
        space: The study's search space.
        params: The failing trial's parameters.
        trial: The failing trial's number, recorded with each culprit.
    """
    reference = space.default_params()
    singles = _singles(space, params)
    passed = [space.to_config(reference)]
    found = []
    for name, choice in singles:
        config = space.to_config({**reference, name: choice})
        reason = _failure(measurer, config)
        if reason is None:
            passed.append(config)
        else:
            found.append(ForbiddenChoice(name, choice, reason, trial))
    if found:
        return found
    for (name, choice), other in itertools.combinations(singles, 2):
        config = space.to_config({**reference, name: choice, other[0]: other[1]})
        if config in passed:
            continue  # one of the pair changes nothing beside the other: measured already
        reason = _failure(measurer, config)
        if reason is not None:
            return [ForbiddenChoice(name, choice, reason, trial, together=(other,))]
        passed.append(config)
    return []


def _failure(measurer: Measurer, config: QuantConfig) -> str | None:
    """Why building and evaluating ``config`` fails, or ``None`` when it runs."""
    try:
        measurer.accuracy(config)
    except Exception as err:  # the failure of these choices: what the study learns
        return failure_reason(err)
    return None


def failing_in_measurement(
    scope_errors: Sequence[ScopeError], max_choices: int = 3
) -> list[ForbiddenChoice]:
    """The least sets of choices (of at most ``max_choices``) that fail wherever they meet in the
    sensitivity measurement (:func:`~optuna_quant.measure.sensitivity.measure_scope_errors`):
    every combination it measured that holds them all failed to build or run.

    The measurement builds every combination of the other scopes, so a set that fails only beside
    a third choice (the reference's per-channel weights, say) holds that choice too, and the
    combinations without it stay drawable.
    """
    entries = [tuple(entry["params"].items()) for entry in scope_errors]
    failed = {i for i, entry in enumerate(scope_errors) if entry["error"] is None}
    holding: dict[tuple[str, Any], set[int]] = {}
    for i, choices in enumerate(entries):
        for choice in choices:
            holding.setdefault(choice, set()).add(i)
    found: list[ForbiddenChoice] = []
    for size in range(1, max_choices + 1):
        for i in sorted(failed):
            for subset in itertools.combinations(entries[i], size):
                if any(set(f.choices.items()) <= set(subset) for f in found):
                    continue  # a smaller set already explains it
                if set.intersection(*(holding[choice] for choice in subset)) <= failed:
                    found.append(ForbiddenChoice(*subset[0], scope_errors[i]["failure"], together=subset[1:]))
    return found


def forbid(study: optuna.Study, lock: StudyLock, found: Sequence[ForbiddenChoice]) -> list[ForbiddenChoice]:
    """Store the choices of ``found`` that the study does not know yet, and log each; those."""
    with lock():
        new = [forbidden for forbidden in found if records.forbid_choice(study, forbidden)]
    for forbidden in new:
        where = "the sensitivity measurement" if forbidden.trial is None else f"trial {forbidden.trial}"
        how = "together" if forbidden.together else "on its own"
        _logger.warning(
            "%s fails %s (%s: %s): the study no longer draws it.", forbidden, how, where, forbidden.reason
        )
    return new


def forbidden_in(study: optuna.Study, params: Mapping[str, Any]) -> ForbiddenChoice | None:
    """The first stored forbidden choice (or pair) that ``params`` hold, or ``None``."""
    return next((f for f in records.forbidden_choices(study) if f.held_by(params)), None)
