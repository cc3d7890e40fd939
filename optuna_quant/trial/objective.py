"""One trial: parameters -> int8 model -> accuracy and latency -> POT's weighted loss.

:class:`QuantizationObjective` is a plain Optuna objective: it works with the study that
:func:`optuna_quant.create_study` builds and with any study a user builds. Its one job is to
measure configurations; the reference trial that scales the loss is :mod:`optuna_quant.trial.reference`,
the stored records :mod:`optuna_quant.trial.records`, and the loop that shares the study between workers
:mod:`optuna_quant.study.worker`. A configuration that a trial measured already is not measured again:
the trial copies that result. One that a running trial claimed is waited for (the wait bounded by
Optuna's heartbeat, :class:`optuna_quant.storages.waiting.Waiter`), then copied.

Example:
    >>> objective = QuantizationObjective("model.onnx", calib, eval_fn)   # doctest: +SKIP
    >>> study = optuna.create_study()                                       # doctest: +SKIP
    >>> study.optimize(objective, n_trials=50)                              # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
import hashlib
import logging
import time
from typing import Any

import onnx
import onnxruntime as ort
import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.trial import records
from optuna_quant.measure.evaluate import accepts_subset_size
from optuna_quant.measure.evaluate import checked_score
from optuna_quant.measure.evaluate import EvalFn
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.latency import LatencyResult
from optuna_quant.measure.latency import measure_latency
from optuna_quant.measure.loss import best_index
from optuna_quant.measure.loss import LossScaling
from optuna_quant.measure.loss import relative_accuracy_loss
from optuna_quant.measure.loss import Result
from optuna_quant.measure.loss import Targets
from optuna_quant.measure.loss import weighted_loss
from optuna_quant.quantization.model_io import batch_of
from optuna_quant.quantization.model_io import load_model
from optuna_quant.quantization.model_io import ModelLike
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.trial.reference import ensure_reference
from optuna_quant.trial.reference import run_reference
from optuna_quant.trial.results import recorded
from optuna_quant.trial.results import result_of
from optuna_quant.trial.space import SCOPES
from optuna_quant.trial.space import SearchSpace
from optuna_quant.trial.stopping import target_reached
from optuna_quant.storages.waiting import fail_stale_trials
from optuna_quant.storages.lock import StudyLock
from optuna_quant.storages.waiting import Waiter

_logger = logging.getLogger("optuna_quant")

# Kept importable from here; optuna_quant.trial.records owns them.
FP32_ACCURACY_KEY = records.FP32_ACCURACY_KEY
SCALING_KEY = records.SCALING_KEY
SPACE_KEY = records.SPACE_KEY
TARGETS_KEY = records.TARGETS_KEY
WORKER_KEY = records.WORKER_KEY
OBJECTIVE_MODES = ("loss", "pareto")
NOISY_SPREAD = 0.05
"""A timing whose ``lat_diff`` spread (interquartile range over median) is above this, or that saw
contention, is timed again."""
RETIMES = 2
"""How many times a noisy timing is repeated at most; the least noisy is kept."""


@dataclass(frozen=True)
class Measurement:
    """What one configuration measured.

    Attributes:
        accuracy: The int8 model's score from ``eval_fn``.
        acc_loss: Relative accuracy loss against fp32.
        latency: The paired latency measurement.
        quantize_seconds: Time to build the int8 model (calibration included, if any ran).
        eval_seconds: Time spent in ``eval_fn``.
        latency_seconds: Time spent timing.
    """

    accuracy: float
    acc_loss: float
    latency: LatencyResult
    quantize_seconds: float
    eval_seconds: float
    latency_seconds: float

    @property
    def lat_diff(self) -> float:
        """``fp32_latency / int8_latency``."""
        return self.latency.lat_diff

    def user_attrs(self) -> dict[str, float | int | bool]:
        """The trial user attrs that record this measurement."""
        return {
            "acc_loss": self.acc_loss,
            "lat_diff": self.lat_diff,
            "accuracy": self.accuracy,
            "fp32_latency_ms": self.latency.fp32_ms,
            "int8_latency_ms": self.latency.int8_ms,
            "lat_diff_spread": self.latency.spread,
            "lat_retimed": self.latency.retimed,
            "lat_contended": self.latency.contended,
            "quantize_s": self.quantize_seconds,
            "eval_s": self.eval_seconds,
            "latency_s": self.latency_seconds,
        }


class QuantizationObjective:
    """The Optuna objective that tunes int8 quantization of one model.

    Args:
        model: An ONNX model: a path or an ``onnx.ModelProto``.
        calibration_data: Iterable of ``{input_name: array}`` (or arrays, for a single input).
        eval_fn: ``eval_fn(session) -> float``, higher is better. It may take ``subset_size``.
        targets: The accuracy and latency targets and loss weights.
        scopes: The tuning scopes that vary (see :mod:`optuna_quant.trial.space`).
        nodes: Restrict the ``layer`` scope to these node names (default: every quantizable node).
        space: A ready search space; overrides ``scopes`` and ``nodes``.
        benchmark: How latency is measured.
        fp32_accuracy: The fp32 baseline (POT's ``metrics``); skips the fp32 evaluation.
        eval_subset_size: Evaluate every model on the first N samples only.
        stop_on_target: Prune a running trial once another trial has met both targets.
        objective_mode: ``"loss"`` returns POT's loss (minimise); ``"pareto"`` returns
            ``(acc_loss, lat_diff)`` for a study with directions ``["minimize", "maximize"]``.
        lock: The lock every worker of the study shares; none needed for a single process.
        pre_process: Prepare the model with onnxruntime's ``quant_pre_process`` before quantizing
            (see :mod:`optuna_quant.quantization.prepare`); fp32 accuracy and latency are always measured on
            the model as given, so ``lat_diff`` is the speed-up the user gets.
        guided: After the reference, measure the per-layer sensitivity once and queue start-up
            trials from it (see :mod:`optuna_quant.trial.guidance`); ``create_study`` sets it.

    Raises:
        FileNotFoundError, ValueError: For a bad model, calibration data or setting; raised here,
            before any trial runs.
    """

    def __init__(
        self,
        model: ModelLike,
        calibration_data: Iterable[Any],
        eval_fn: EvalFn,
        *,
        targets: Targets | None = None,
        scopes: Iterable[str] = SCOPES,
        nodes: Iterable[str] | None = None,
        space: SearchSpace | None = None,
        benchmark: BenchmarkSettings | None = None,
        fp32_accuracy: float | None = None,
        eval_subset_size: int | None = None,
        stop_on_target: bool = False,
        objective_mode: str = "loss",
        lock: StudyLock | None = None,
        pre_process: bool = True,
        guided: bool = False,
    ) -> None:
        if objective_mode not in OBJECTIVE_MODES:
            raise ValueError(f"Unknown objective_mode {objective_mode!r}; choose from {OBJECTIVE_MODES}.")
        if not callable(eval_fn):
            raise TypeError(f"eval_fn must be callable, got {eval_fn!r}.")
        if eval_subset_size is not None:
            if isinstance(eval_subset_size, bool) or not isinstance(eval_subset_size, int) or eval_subset_size < 1:
                raise ValueError(f"eval_subset_size must be a positive integer, got {eval_subset_size!r}.")
            if not accepts_subset_size(eval_fn):
                raise ValueError(
                    "eval_subset_size is set but eval_fn takes no 'subset_size' keyword; "
                    "add one, or use optuna_quant.Top1Accuracy."
                )
        self.model = load_model(model)
        self.feeds = to_feeds(calibration_data, self.model)
        self.prepared = prepare_model(self.model, self.feeds, pre_process=pre_process)
        self.space = space or SearchSpace.from_model(self.prepared.prepared, scopes=scopes, nodes=nodes)
        self.targets = targets or Targets()
        self.benchmark = benchmark or BenchmarkSettings()
        self.eval_fn = eval_fn
        self.eval_subset_size = eval_subset_size
        self.stop_on_target = stop_on_target
        self.objective_mode = objective_mode
        self.lock: StudyLock = lock or nullcontext
        self.guided = guided
        self.fp32_accuracy = None if fp32_accuracy is None else checked_score(fp32_accuracy, "metrics")
        try:
            self.latency_feed = batch_of(self.feeds, self.benchmark.batch_size)
        except ValueError as err:
            raise ValueError(f"benchmark.batch_size: {err} (calibration_data)") from err
        serialized = self.model.SerializeToString()  # once: large models take seconds
        self.quantizer = Quantizer(self.prepared.prepared, self.feeds)
        self.model_sha256 = hashlib.sha256(serialized).hexdigest()
        self._fp32_session = self._session(serialized)
        self.scaling: LossScaling | None = None
        self.max_trials: int | None = None
        self.started = time.perf_counter()

    def _session(self, model: onnx.ModelProto | bytes) -> ort.InferenceSession:
        serialized = model if isinstance(model, bytes) else model.SerializeToString()
        return ort.InferenceSession(serialized, self.benchmark.session_options(), providers=["CPUExecutionProvider"])

    def _evaluate(self, session: ort.InferenceSession, what: str) -> float:
        kwargs = {} if self.eval_subset_size is None else {"subset_size": self.eval_subset_size}
        try:
            value = self.eval_fn(session, **kwargs)
        except Exception as err:
            raise RuntimeError(f"eval_fn raised on the {what} model: {err!r}") from err
        return checked_score(value, f"eval_fn on the {what} model")

    def build(self, params: Mapping[str, Any]) -> onnx.ModelProto:
        """The int8 model of the configuration ``params``, from cached calibration.

        Raises:
            ValueError: If ``params`` do not describe a configuration of the space.
        """
        return self.quantizer.quantize(self.space.to_config(params))

    def accuracy(self, params: Mapping[str, Any]) -> float:
        """The int8 score of the configuration ``params``, without timing it."""
        return self._evaluate(self._session(self.build(params)), "int8")

    def measure(self, params: Mapping[str, Any]) -> Measurement:
        """Build, evaluate and time the configuration ``params`` (no study needed).

        Raises:
            ValueError: If ``params`` do not describe a configuration of the space.
            RuntimeError: If ``eval_fn`` raises or returns something other than a finite number.
        """
        start = time.perf_counter()
        int8_model = self.build(params)
        return self.measure_model(int8_model, quantize_seconds=time.perf_counter() - start)

    def measure_model(self, int8_model: onnx.ModelProto, *, quantize_seconds: float = 0.0) -> Measurement:
        """Evaluate and time a ready int8 model exactly as :meth:`measure` does a configuration.

        For a model that is no configuration of the search space, such as a QAT export: the same
        ``eval_fn``, fp32 baseline and paired latency timing make its figures comparable with
        the trials', and :meth:`loss` gives its POT loss.

        Args:
            int8_model: The quantized model; it takes the same inputs as the fp32 model.
            quantize_seconds: Time already spent building ``int8_model``. Creating its
                onnxruntime session is added, as it is for a configuration.

        Raises:
            RuntimeError: If ``eval_fn`` raises or returns something other than a finite number.

        Example:
            >>> qat_onnx = export_qat(qat, torch.zeros(1, 1, 28, 28))   # doctest: +SKIP
            >>> objective.measure_model(qat_onnx).acc_loss              # doctest: +SKIP
        """
        fp32_accuracy = self.baseline()
        start = time.perf_counter()
        int8 = self._session(int8_model)
        built = time.perf_counter()
        accuracy = self._evaluate(int8, "int8")
        evaluated = time.perf_counter()
        latency = self._timed(int8)
        return Measurement(
            accuracy=accuracy,
            acc_loss=relative_accuracy_loss(fp32_accuracy, accuracy),
            latency=latency,
            quantize_seconds=quantize_seconds + built - start,
            eval_seconds=evaluated - built,
            latency_seconds=time.perf_counter() - evaluated,
        )

    def _timed(self, int8: ort.InferenceSession) -> LatencyResult:
        """The paired timing of ``int8`` against fp32; a noisy one is timed again, the least noisy kept.

        A timing is noisy when it saw contention or its spread is above :data:`NOISY_SPREAD`: on a
        machine oversubscribed three times over, one configuration of a 51-layer recognizer read
        ``lat_diff`` 1.82 (spread 0.12) where it reads 1.37 (spread 0.004) alone, and such a
        phantom speed-up would become the study's best.
        """
        latency = measure_latency(self._fp32_session, int8, self.latency_feed, self.benchmark)
        for attempt in range(1, RETIMES + 1):
            if not (latency.contended or latency.spread > NOISY_SPREAD):
                break
            _logger.info(
                "Timing noisy (lat_diff %.4f, spread %.3f%s): timing again (%d / %d).",
                latency.lat_diff,
                latency.spread,
                ", contended" if latency.contended else "",
                attempt,
                RETIMES,
            )
            again = measure_latency(self._fp32_session, int8, self.latency_feed, self.benchmark)
            if again.spread < latency.spread:
                latency = again
        return latency

    def baseline(self) -> float:
        """The fp32 accuracy: from ``metrics``, or measured once."""
        if self.fp32_accuracy is None:
            self.fp32_accuracy = self._evaluate(self._fp32_session, "fp32")
            if self.fp32_accuracy == 0:
                raise ValueError("eval_fn scores the fp32 model 0: a relative accuracy loss is undefined.")
        return self.fp32_accuracy

    def loss(self, measurement: Measurement) -> float:
        """POT's weighted loss of ``measurement`` under the study's scaling."""
        if self.scaling is None:
            raise RuntimeError("The loss scaling is not set yet: the reference trial has not run.")
        return weighted_loss(measurement.acc_loss, measurement.lat_diff, self.targets, self.scaling)

    def values(self, acc_loss: float, lat_diff: float, loss: float) -> float | list[float]:
        """The objective value(s) of a result: POT's loss, or ``[acc_loss, lat_diff]`` in Pareto mode."""
        return [acc_loss, lat_diff] if self.objective_mode == "pareto" else loss

    def record(self, trial: optuna.Trial, measurement: Measurement, loss: float) -> None:
        """Record ``measurement`` and its loss on ``trial``."""
        attrs = {**measurement.user_attrs(), "loss": loss}
        records.record_result(trial, attrs, self.targets.constraints(measurement.acc_loss, measurement.lat_diff))

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        study = trial.study
        records.start_trial(trial)
        if records.is_reference(trial):
            if records.reference_scaling(study) is None:
                return run_reference(self, trial)
            # A queued reference whose scaling another trial stored: an ordinary repeat of it.
            records.unmark_reference(trial)
        ensure_reference(self, study)
        params = self.space.suggest(trial)
        total = "?" if self.max_trials is None else self.max_trials
        _logger.info("Trial iteration start: %d / %s", trial.number, total)
        previous, seen = self._claim(study, trial, params)
        if previous is not None:
            records.copy_result(trial, previous)
            _logger.info(
                "Params already evaluated. Returning previous result: acc_loss: %.4f lat_diff: %.4f",
                previous.user_attrs["acc_loss"],
                previous.user_attrs["lat_diff"],
            )
            self._log_end(seen, trial.number, total)
            return list(previous.values) if self.objective_mode == "pareto" else float(previous.value)
        if self.stop_on_target:
            number = target_reached(seen, self.targets)
            if number is not None:
                raise optuna.TrialPruned(f"Trial {number} already met both targets.")
        try:
            measurement = self.measure(params)
        except Exception as err:
            records.record_failure(trial, err)
            raise
        loss = self.loss(measurement)
        self.record(trial, measurement, loss)
        _logger.info(
            "Current iteration acc_loss: %.4f lat_diff: %.4f exec_time: %.2f min",
            measurement.acc_loss,
            measurement.lat_diff,
            (time.perf_counter() - self.started) / 60,
        )
        self._log_end(seen, trial.number, total, Result(measurement.acc_loss, measurement.lat_diff, loss))
        return self.values(measurement.acc_loss, measurement.lat_diff, loss)

    def _claim(
        self, study: optuna.Study, trial: optuna.Trial, params: Mapping[str, Any]
    ) -> tuple[FrozenTrial | None, list[FrozenTrial]]:
        """The trial that measured ``params`` already, or ``None`` once ``trial`` claimed them.

        A configuration that another running trial claimed is waited for, so that no two workers
        measure it; if that trial's worker dies, the heartbeat fails it and this one measures.

        Returns:
            That trial or ``None``, and the complete and running trials read to decide: the
            stop-on-target check and the trial's last log line reuse them.
        """
        waiter = Waiter()
        while True:
            with self.lock():
                if waiter.waiting:  # a dead worker's claim ends with its trial
                    fail_stale_trials(study)
                measuring = None
                seen = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
                for other in seen:
                    if other.number == trial.number or other.params != params:
                        continue
                    if other.state == TrialState.COMPLETE and records.measured(other):
                        waiter.done()
                        return other, seen
                    if other.state == TrialState.RUNNING and records.is_measuring(other):
                        measuring = other
                if measuring is None:
                    records.claim(trial)
                    waiter.done()
                    return None, seen
            waiter.beat(f"trial {measuring.number}, which measures the same configuration")

    def _log_end(self, seen: list[FrozenTrial], number: int, total: object, current: Result | None = None) -> None:
        # ``seen`` was read before measuring: a trial another worker finished meanwhile is missing,
        # which a log line can afford. This trial is not recorded there yet: it counts as ``current``.
        results = [result_of(t) for t in recorded(seen)] + ([] if current is None else [current])
        best = results[best_index(results, self.targets)]  # type: ignore[index]
        _logger.info(
            "Trial iteration end: %d / %s acc_loss: %.4f lat_diff: %.4f", number, total, best.acc_loss, best.lat_diff
        )
