"""When and how much of the sensitivity a study measures: between trials, after the recipes.

A guided study (``create_study(sensitivity=True)``) runs its reference and the queued recipe trials
(:mod:`optuna_quant.trial.recipes`) first, so that it holds a good simple model at once. Then one
worker, the first to find the queue empty, claims the measurement
(:func:`~optuna_quant.trial.records.claim_sensitivity`) and measures what its share of the
study's time affords (:mod:`optuna_quant.trial.budget`), between two of its trials; the other
workers go on with the search meanwhile. The measurement stores the guidance, which every
worker's sampler takes before its next trial, and queues the start-up trials
(:func:`optuna_quant.trial.guidance.guide_study`).

Example:
    >>> if due(study, trials, objective.settings):                             # doctest: +SKIP
    ...     measure_when_claimed(study, objective, lock, trials, n_trials=40, seconds_left=None)
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
import logging
import statistics
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.storages.lock import StudyLock
from optuna_quant.trial import records
from optuna_quant.trial.budget import calibration_estimate
from optuna_quant.trial.budget import estimate_seconds
from optuna_quant.trial.budget import FULL
from optuna_quant.trial.budget import model_seconds
from optuna_quant.trial.budget import plan_sensitivity
from optuna_quant.trial.budget import planned_seconds
from optuna_quant.trial.budget import PLANS
from optuna_quant.trial.budget import SensitivityPlan
from optuna_quant.trial.guidance import guide_study
from optuna_quant.trial.objective import QuantizationObjective
from optuna_quant.trial.objective import TrialSettings


_logger = logging.getLogger("optuna_quant")


def settled(study: optuna.Study) -> bool:
    """Whether a worker claimed the study's sensitivity measurement, or it is stored."""
    return records.sensitivity_plan(study) is not None or records.stored_guidance(study) is not None


def due(study: optuna.Study, trials: Sequence[FrozenTrial], settings: TrialSettings) -> bool:
    """Whether a worker should measure the study's sensitivity before its next trial: guided,
    the measured reference among ``trials``, nothing queued (the recipes run first), and no
    worker claimed it yet.

    Other workers start trials once the reference's scaling is stored, before its trial records
    its measurement and queues the recipes: a read from then holds neither, and the measurement
    needs the reference.
    """
    if not settings.guided or any(t.state == TrialState.WAITING for t in trials):
        return False
    if not any(records.is_reference(t) and records.measured(t) for t in trials):
        return False
    return not settled(study)


def measure_when_claimed(
    study: optuna.Study,
    objective: QuantizationObjective,
    lock: StudyLock,
    trials: Sequence[FrozenTrial],
    n_trials: int | None,
    seconds_left: float | None,
    room: Callable[[], int | None] = lambda: None,
) -> bool:
    """Claim the sensitivity measurement and, if this worker got it, measure as much as its
    share of the study's time affords; a measurement that fails leaves the study unguided.

    Args:
        study: The study.
        objective: The study's objective: its measurer, space, targets and settings.
        lock: The lock every worker shares.
        trials: The study's trials, read for this decision.
        n_trials: The study's trials in total, if known.
        seconds_left: What is left of the study's timeout, if it has one.
        room: The trials the study's budget still has room for (``None``: no limit), which the
            start-up trials may take.

    Returns:
        Whether this worker claimed it.

    Raises:
        KeyboardInterrupt: Re-raised once the claim is released for the next run.
    """
    with lock():
        if not records.claim_sensitivity(study):
            return False
    try:
        reference = next((t for t in trials if records.is_reference(t) and records.measured(t)), None)
        if reference is None:  # recorded before any worker ran (a plain study): nothing to share out
            raise RuntimeError("The study has no measured reference trial.")
        plan, decision = choose_plan(objective, trials, n_trials, seconds_left, reference)
        with lock():
            records.store_sensitivity_plan(study, decision)
        if plan is None:
            _logger.info(
                "Sensitivity: not measured: its cheapest plan, estimated at %.1f s, does not fit %.1f s, "
                "its share of the study's time.",
                decision["estimate_s"],
                decision["budget_s"],
            )
        else:
            space, targets, acc_loss = objective.space, objective.targets, records.acc_loss(reference)
            guide_study(study, lock, objective.measurer, space, acc_loss, n_trials, targets, plan, room)
    except KeyboardInterrupt:
        with lock():
            records.store_sensitivity_plan(study, None)
        raise
    except Exception as err:  # the guidance helps the search; the study goes on without it
        _logger.warning("Sensitivity: the measurement failed, the search goes on unguided: %r", err)
        with lock():
            records.store_sensitivity_plan(study, {"plan": None, "failure": repr(err)[:300]})
    return True


def choose_plan(
    objective: QuantizationObjective,
    trials: Sequence[FrozenTrial],
    n_trials: int | None,
    seconds_left: float | None,
    reference: FrozenTrial,
) -> tuple[SensitivityPlan | None, dict[str, Any]]:
    """What the study's sensitivity measurement may take and measures, from the trials run so far
    (:func:`~optuna_quant.trial.budget.plan_sensitivity`), and the decision as the study records it.

    Costs one model's output error, built as ``reference`` was, to time what a model costs.
    """
    share = objective.settings.sensitivity_share
    if share is None:
        return FULL, {"plan": FULL.name}
    measured = [t for t in trials if t.state == TrialState.COMPLETE and records.measured(t)]
    trial_seconds = [
        (t.datetime_complete - t.datetime_start).total_seconds()
        for t in measured
        if t.datetime_start is not None and t.datetime_complete is not None
    ]
    # A copy's seconds are its original's: each measurement's timing counts once.
    latency = [timing for _, _, timing in map(records.seconds_spent, measured) if timing > 0]
    budget = share * planned_seconds(trial_seconds, n_trials, seconds_left)
    per_model = model_seconds(objective.measurer, objective.space.to_config(reference.params))
    costs = {
        "model_seconds": per_model,
        "latency_seconds": statistics.median(latency) if latency else 0.0,
        "calibration_seconds": calibration_estimate(objective.measurer),
    }
    plan = plan_sensitivity(objective.space, budget_seconds=budget, **costs)
    if plan is None:  # what the cheapest would take, for the message
        cheapest = estimate_seconds(objective.space, PLANS[-1], **costs)
        return None, {"plan": None, "budget_s": budget, "estimate_s": cheapest, "model_s": per_model}
    return plan, {"plan": plan.name, "budget_s": budget, "estimate_s": plan.estimate_seconds, "model_s": per_model}
