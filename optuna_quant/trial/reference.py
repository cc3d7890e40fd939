"""The reference trial: the space's default configuration, measured once per study.

Its ``acc_loss`` and ``lat_diff`` scale POT's loss (:class:`optuna_quant.measure.loss.LossScaling`) for
every later trial, so every worker must use the same one. Under a worker loop
(:mod:`optuna_quant.study.worker`) the reference is a queued trial (``user_attrs={"reference": True}``)
that the first worker to ask pops while the others wait for it; if that worker dies, Optuna's
heartbeat fails the trial and queues it again, for a waiting worker to pop. The objective used on
a plain Optuna study measures it before its first trial instead (:func:`ensure_reference`).

Example:
    >>> study.optimize(objective, n_trials=10)   # doctest: +SKIP
    INFO:optuna_quant:Reference (default configuration): measuring ...
    INFO:optuna_quant:Reference (default configuration) acc_loss: 0.0054 lat_diff: 1.2787 (3.1 s)
"""

from __future__ import annotations

import logging
import time
from typing import Any
from typing import TYPE_CHECKING

import optuna

from optuna_quant.trial import records
from optuna_quant.trial.guidance import guide_study
from optuna_quant.measure.loss import LossScaling

if TYPE_CHECKING:
    from optuna_quant.trial.objective import Measurement
    from optuna_quant.trial.objective import QuantizationObjective

_logger = logging.getLogger("optuna_quant")
_WHAT = "Reference (default configuration)"


class ReferenceMeasurementError(ValueError, RuntimeError):
    """The reference could not be measured: no trial can be scored without it.

    The message is one line that names ``eval_fn``, the reference and the reason. It is a
    ``ValueError`` (bad input: the ``eval_fn``) and a ``RuntimeError`` (what ``eval_fn`` raised).
    """


def check_baseline(objective: QuantizationObjective) -> None:
    """Score the fp32 model before any trial, so that an ``eval_fn`` that fails leaves no trial.

    Raises:
        ReferenceMeasurementError: If ``eval_fn`` raises or returns no finite number.
    """
    try:
        objective.baseline()
    except Exception as err:
        raise _error(err) from err


def _error(err: Exception) -> ReferenceMeasurementError:
    reason = " ".join(str(err).split())
    return ReferenceMeasurementError(
        f"eval_fn could not score the reference (the fp32 model and its default int8 configuration): {reason}"
    )


def measure_reference(
    objective: QuantizationObjective, params: dict[str, Any]
) -> tuple[Measurement, LossScaling]:
    """Measure the reference configuration ``params`` and the loss scaling it gives.

    Raises:
        ReferenceMeasurementError: If the fp32 baseline or the reference's measurement fails.
    """
    _logger.info("%s: measuring the fp32 baseline and the default int8 configuration.", _WHAT)
    start = time.perf_counter()
    try:
        objective.baseline()
        measurement = objective.measure(params)  # a noisy timing is repeated, as for every trial
    except Exception as err:
        raise _error(err) from err
    scaling = LossScaling.from_reference(measurement.acc_loss, measurement.lat_diff, objective.targets)
    _logger.info(
        "%s acc_loss: %.4f lat_diff: %.4f (%.1f s)",
        _WHAT,
        measurement.acc_loss,
        measurement.lat_diff,
        time.perf_counter() - start,
    )
    return measurement, scaling


def run_reference(objective: QuantizationObjective, trial: optuna.Trial) -> float | list[float]:
    """Measure the reference as ``trial`` (a queued reference trial) and store its scaling once."""
    params = objective.space.suggest(trial)
    try:
        measurement, scaling = measure_reference(objective, params)
    except ReferenceMeasurementError as err:
        records.record_failure(trial, err)
        raise
    if objective.guided:
        # Before the scaling is stored: the other workers wait for the reference until then, so
        # they start with the prior, and a worker killed here has its reference trial run again.
        try:
            guide_study(objective, trial.study, measurement.acc_loss)
        except Exception as err:  # the guidance helps the search; the study goes on without it
            _logger.warning("%s: the sensitivity measurement failed, the search goes on unguided: %r", _WHAT, err)
    _adopt(objective, trial.study, measurement, scaling)
    loss = objective.loss(measurement)
    objective.record(trial, measurement, loss)
    return objective.values(measurement.acc_loss, measurement.lat_diff, loss)


def ensure_reference(objective: QuantizationObjective, study: optuna.Study) -> None:
    """Give ``objective`` the study's scaling, measuring the reference here if the study has none.

    A worker loop runs no trial before its reference trial completed; a plain Optuna study, fed
    by one process, gets its reference recorded as an extra trial before its first one.
    """
    if objective.scaling is not None:
        return
    stored = records.reference_scaling(study)
    if stored is None:
        params = objective.space.default_params()
        measurement, scaling = measure_reference(objective, params)
        loss = _adopt(objective, study, measurement, scaling)
        records.reference_trial(
            study,
            params,
            objective.space.distributions(),
            _as_list(objective.values(measurement.acc_loss, measurement.lat_diff, loss)),
            {**measurement.user_attrs(), "loss": loss},
            objective.targets.constraints(measurement.acc_loss, measurement.lat_diff),
        )
        return
    objective.fp32_accuracy, objective.scaling = stored


def _adopt(
    objective: QuantizationObjective, study: optuna.Study, measurement: Measurement, scaling: LossScaling
) -> float:
    # The first reference stored wins: a worker killed after storing it had its trial run again.
    with objective.lock():
        records.store_reference(study, objective.baseline(), measurement.latency.fp32_ms, scaling)
        stored = records.reference_scaling(study)
    assert stored is not None
    objective.fp32_accuracy, objective.scaling = stored
    return objective.loss(measurement)


def _as_list(values: float | list[float]) -> list[float]:
    return values if isinstance(values, list) else [values]
