"""The reference: the space's default configuration, measured once per study.

Its ``acc_loss`` and ``lat_diff`` scale POT's loss (:class:`optuna_quant.measure.loss.LossScaling`)
for every later trial, so every worker must use the same one: the first stored wins
(:func:`store_reference`). Under a worker loop (:mod:`optuna_quant.study.worker`) the reference is a
queued trial that the first worker to ask pops while the others wait for it; the objective on a
plain Optuna study measures it before its first trial instead.

Example:
    >>> measurement, scaling = measure_reference(measurer, QuantConfig(), Targets())   # doctest: +SKIP
    INFO:optuna_quant:Reference (default configuration): measuring ...
    INFO:optuna_quant:Reference (default configuration) acc_loss: 0.0054 lat_diff: 1.2787 (3.1 s)
"""

from __future__ import annotations

import logging
import time

import optuna

from optuna_quant.measure.loss import LossScaling
from optuna_quant.measure.loss import Targets
from optuna_quant.measure.measurer import Measurement
from optuna_quant.measure.measurer import Measurer
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.storages.lock import StudyLock
from optuna_quant.trial import records


_logger = logging.getLogger("optuna_quant")
WHAT = "Reference (default configuration)"
"""How the log lines name the reference."""


class ReferenceMeasurementError(ValueError, RuntimeError):
    """The reference could not be measured: no trial can be scored without it.

    The message is one line that names ``eval_fn``, the reference and the reason. It is a
    ``ValueError`` (bad input: the ``eval_fn``) and a ``RuntimeError`` (what ``eval_fn`` raised).
    """


def check_baseline(measurer: Measurer) -> None:
    """Score the fp32 model before any trial, so that an ``eval_fn`` that fails leaves no trial.

    Raises:
        ReferenceMeasurementError: If ``eval_fn`` raises or returns no finite number.
    """
    try:
        measurer.baseline()
    except Exception as err:
        raise _error(err) from err


def _error(err: Exception) -> ReferenceMeasurementError:
    reason = " ".join(str(err).split())
    return ReferenceMeasurementError(
        f"eval_fn could not score the reference (the fp32 model and its default int8 configuration): {reason}"
    )


def measure_reference(measurer: Measurer, config: QuantConfig, targets: Targets) -> tuple[Measurement, LossScaling]:
    """Measure the reference configuration and the loss scaling it gives.

    Raises:
        ReferenceMeasurementError: If the fp32 baseline or the reference's measurement fails.
    """
    _logger.info("%s: measuring the fp32 baseline and the default int8 configuration.", WHAT)
    start = time.perf_counter()
    try:
        measurer.baseline()
        measurement = measurer.measure(config)
    except Exception as err:
        raise _error(err) from err
    scaling = LossScaling.from_reference(measurement.acc_loss, measurement.lat_diff, targets)
    _logger.info(
        "%s acc_loss: %.4f lat_diff: %.4f (%.1f s)",
        WHAT,
        measurement.acc_loss,
        measurement.lat_diff,
        time.perf_counter() - start,
    )
    return measurement, scaling


def store_reference(
    study: optuna.Study, lock: StudyLock, fp32_accuracy: float, measurement: Measurement, scaling: LossScaling
) -> tuple[float, LossScaling]:
    """Store what the reference measured unless a reference did already; the study's values.

    The first reference stored wins: a worker killed after storing it had its trial run again.
    """
    with lock():
        records.store_reference(study, fp32_accuracy, measurement.latency.fp32_ms, scaling)
        stored = records.reference_scaling(study)
    assert stored is not None
    return stored
