"""What a failing configuration teaches the study: which of its choices fails on its own.

When a trial's configuration fails (building it, loading it or ``eval_fn`` raises), each of its
choices of the other scopes that differs from the reference is measured again alone on the
reference, without timing (:func:`culprits`): one that fails there too fails because of itself
(a calibration method, an approach, an operator-type set on this graph), and the study stores it
(:func:`optuna_quant.trial.records.forbid_choice`) so that every worker agrees. From then on:

- optuna-quant's samplers get it as a score of 0, never, in their prior
  (:func:`optuna_quant.trial.guidance.set_prior`);
- a trial that another sampler gives it fails at once with the stored reason, unmeasured
  (:class:`ForbiddenChoiceError`).

The sensitivity measurement finds such choices before any trial does (:func:`failing_alone`):
it builds every combination of the other scopes. A failure that no single choice explains (a
combination, a layer) is a plain failed trial, which the samplers never draw again.

Example:
    >>> found = culprits(measurer, space, {"range_estimator": "entropy", ...}, trial=3)  # doctest: +SKIP
    >>> [str(f) for f in found]                                                            # doctest: +SKIP
    ["range_estimator='entropy'"]
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
import logging
from typing import Any

import optuna

from optuna_quant.measure.measurer import Measurer
from optuna_quant.measure.sensitivity import failure_reason
from optuna_quant.measure.sensitivity import ScopeError
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
    """The choices of ``params`` that fail alone on the reference configuration.

    Each one costs a build and an ``eval_fn`` run, no timing; only failing trials pay it.

    Args:
        measurer: Builds and evaluates the configurations.
        space: The study's search space.
        params: The failing trial's parameters.
        trial: The failing trial's number, recorded with each culprit.
    """
    reference = space.default_params()
    found = []
    for name, choice in _singles(space, params):
        try:
            measurer.accuracy(space.to_config({**reference, name: choice}))
        except Exception as err:  # the failure of this choice alone: what the study learns
            found.append(ForbiddenChoice(name, choice, failure_reason(err), trial))
    return found


def failing_alone(space: SearchSpace, scope_errors: Sequence[ScopeError]) -> list[ForbiddenChoice]:
    """The choices whose combination with the reference's other choices failed to build or run
    in the sensitivity measurement (:func:`~optuna_quant.measure.sensitivity.measure_scope_errors`)."""
    reference = space.default_params()
    found = []
    for entry in scope_errors:
        if entry["error"] is not None:
            continue
        changed = [(name, choice) for name, choice in entry["params"].items() if choice != reference[name]]
        if len(changed) == 1:
            found.append(ForbiddenChoice(*changed[0], entry["failure"]))
    return found


def forbid(study: optuna.Study, lock: StudyLock, found: Sequence[ForbiddenChoice]) -> list[ForbiddenChoice]:
    """Store the choices of ``found`` that the study does not know yet, and log each; those."""
    with lock():
        new = [forbidden for forbidden in found if records.forbid_choice(study, forbidden)]
    for forbidden in new:
        where = "the sensitivity measurement" if forbidden.trial is None else f"trial {forbidden.trial}"
        _logger.warning(
            "%s fails on its own (%s: %s): the study no longer draws it.", forbidden, where, forbidden.reason
        )
    return new


def forbidden_in(study: optuna.Study, params: Mapping[str, Any]) -> ForbiddenChoice | None:
    """The first stored forbidden choice that ``params`` hold, or ``None``."""
    return next(
        (f for f in records.forbidden_choices(study) if f.param in params and params[f.param] == f.choice), None
    )
