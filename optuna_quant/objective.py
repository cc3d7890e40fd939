"""One trial: parameters -> int8 model -> accuracy and latency -> POT's weighted loss.

:class:`QuantizationObjective` is a plain Optuna objective: it works with the study that
:func:`optuna_quant.create_study` builds and with any study a user builds. What every worker of a
study must agree on (the fp32 accuracy, the loss scaling from the reference trial, the search
space and the model's fingerprint) is stored in the study's user attrs the first time and read
from there afterwards, so a second worker neither re-measures nor disagrees. Workers that share a
study also share a lock (:func:`optuna_quant.storage.study_lock`): one worker claims the reference
trial while the others wait for its scaling, and one trial claims each configuration while a trial
that drew the same one waits for its result.

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

from optuna_quant.claims import ClaimWatch
from optuna_quant.claims import KeepClaim
from optuna_quant.claims import REFERENCE_CLAIM_KEY
from optuna_quant.claims import WORKER
from optuna_quant.evaluate import accepts_subset_size
from optuna_quant.evaluate import checked_score
from optuna_quant.evaluate import EvalFn
from optuna_quant.latency import BenchmarkSettings
from optuna_quant.latency import LatencyResult
from optuna_quant.latency import measure_latency
from optuna_quant.loss import best_index
from optuna_quant.loss import LossScaling
from optuna_quant.loss import relative_accuracy_loss
from optuna_quant.loss import Result
from optuna_quant.loss import Targets
from optuna_quant.loss import weighted_loss
from optuna_quant.model_io import batch_of
from optuna_quant.model_io import load_model
from optuna_quant.model_io import ModelLike
from optuna_quant.model_io import to_feeds
from optuna_quant.quantize import Quantizer
from optuna_quant.results import recorded
from optuna_quant.results import result_of
from optuna_quant.space import SCOPES
from optuna_quant.space import SearchSpace
from optuna_quant.stopping import target_reached
from optuna_quant.storage import optuna_warnings_off
from optuna_quant.storage import StudyLock

_logger = logging.getLogger("optuna_quant")

FP32_ACCURACY_KEY = "fp32_accuracy"
FP32_LATENCY_KEY = "fp32_latency_ms"
SCALING_KEY = "loss_scaling"
REFERENCE_KEY = "reference"
SPACE_KEY = "search_space"
TARGETS_KEY = "targets"
MODEL_KEY = "model_sha256"
WORKER_KEY = "worker"
OBJECTIVE_MODES = ("loss", "pareto")


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

    def user_attrs(self) -> dict[str, float]:
        """The trial user attrs that record this measurement."""
        return {
            "acc_loss": self.acc_loss,
            "lat_diff": self.lat_diff,
            "accuracy": self.accuracy,
            "fp32_latency_ms": self.latency.fp32_ms,
            "int8_latency_ms": self.latency.int8_ms,
            "lat_diff_spread": self.latency.spread,
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
        scopes: The tuning scopes that vary (see :mod:`optuna_quant.space`).
        nodes: Restrict the ``layer`` scope to these node names (default: every quantizable node).
        space: A ready search space; overrides ``scopes`` and ``nodes``.
        benchmark: How latency is measured.
        fp32_accuracy: The fp32 baseline (POT's ``metrics``); skips the fp32 evaluation.
        eval_subset_size: Evaluate every model on the first N samples only.
        stop_on_target: Prune a running trial once another trial has met both targets.
        objective_mode: ``"loss"`` returns POT's loss (minimise); ``"pareto"`` returns
            ``(acc_loss, lat_diff)`` for a study with directions ``["minimize", "maximize"]``.
        lock: The lock every worker of the study shares; none needed for a single process.
        wait_timeout: Seconds a worker waits for another one's reference trial or result.

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
        wait_timeout: float = 3600.0,
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
        self.space = space or SearchSpace.from_model(self.model, scopes=scopes, nodes=nodes)
        self.targets = targets or Targets()
        self.benchmark = benchmark or BenchmarkSettings()
        self.eval_fn = eval_fn
        self.eval_subset_size = eval_subset_size
        self.stop_on_target = stop_on_target
        self.objective_mode = objective_mode
        self.lock: StudyLock = lock or nullcontext
        self.wait_timeout = wait_timeout
        self.fp32_accuracy = None if fp32_accuracy is None else checked_score(fp32_accuracy, "metrics")
        feeds = to_feeds(calibration_data, self.model)
        try:
            self.latency_feed = batch_of(feeds, self.benchmark.batch_size)
        except ValueError as err:
            raise ValueError(f"benchmark.batch_size: {err} (calibration_data)") from err
        serialized = self.model.SerializeToString()  # once: large models take seconds
        self.quantizer = Quantizer(serialized, feeds)
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
        latency = measure_latency(self._fp32_session, int8, self.latency_feed, self.benchmark)
        return Measurement(
            accuracy=accuracy,
            acc_loss=relative_accuracy_loss(fp32_accuracy, accuracy),
            latency=latency,
            quantize_seconds=quantize_seconds + built - start,
            eval_seconds=evaluated - built,
            latency_seconds=time.perf_counter() - evaluated,
        )

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
            raise RuntimeError("The loss scaling is not set yet: call prepare(study) first.")
        return weighted_loss(measurement.acc_loss, measurement.lat_diff, self.targets, self.scaling)

    def prepare(self, study: optuna.Study) -> None:
        """Share the fp32 baseline and loss scaling through ``study``, measuring them if new.

        The first worker claims the reference configuration (the space's default) under the
        study lock, measures it, records it as a trial and stores the scaling; a worker that
        starts meanwhile waits for that scaling rather than measuring a second one. A measurement
        that raises releases the claim, and a claim whose worker stopped refreshing it for
        ``claims.CLAIM_STALE_SECONDS`` is taken over.

        Raises:
            ValueError: If the study was made for another model, space or targets.
            TimeoutError: If the scaling does not appear within ``wait_timeout`` seconds.
        """
        if self.scaling is not None:
            return
        own = {
            MODEL_KEY: self.model_sha256,
            SPACE_KEY: self.space.to_dict(),
            TARGETS_KEY: self.targets.to_dict(),
        }
        watch = ClaimWatch(self.wait_timeout)
        while True:
            with self.lock():
                attrs = study.user_attrs
                for key, value in own.items():
                    if key in attrs and attrs[key] != value:
                        raise ValueError(
                            f"Study {study.study_name!r} was made with another {key.replace('_', ' ')} "
                            f"({attrs[key]!r}, here {value!r}); use another study name or cold_start."
                        )
                if SCALING_KEY in attrs:
                    self.fp32_accuracy = attrs[FP32_ACCURACY_KEY]
                    self.scaling = LossScaling.from_dict(attrs[SCALING_KEY])
                    return
                claim = attrs.get(REFERENCE_CLAIM_KEY)
                if watch.abandoned(claim):
                    for key, value in own.items():
                        study.set_user_attr(key, value)
                    study.set_user_attr(REFERENCE_CLAIM_KEY, {"worker": WORKER, "beat": 0})
                    break
            watch.wait(f"the reference trial of worker {claim['worker']}")
        with KeepClaim(study):
            self._measure_reference(study)

    def _measure_reference(self, study: optuna.Study) -> None:
        fp32_accuracy = self.baseline()
        params = self.space.default_params()
        reference = self.measure(params)
        scaling = LossScaling.from_reference(reference.acc_loss, reference.lat_diff, self.targets)
        loss = weighted_loss(reference.acc_loss, reference.lat_diff, self.targets, scaling)
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions=self.space.distributions(),
                values=self._values(reference.acc_loss, reference.lat_diff, loss),
                user_attrs={**reference.user_attrs(), "loss": loss, WORKER_KEY: WORKER, REFERENCE_KEY: True},
                constraints=self._constraints(reference),
            )
        )
        # The scaling is written last: other workers start as soon as it appears.
        study.set_user_attr(FP32_ACCURACY_KEY, fp32_accuracy)
        study.set_user_attr(FP32_LATENCY_KEY, reference.latency.fp32_ms)
        study.set_user_attr(SCALING_KEY, scaling.to_dict())
        self.scaling = scaling
        _logger.info(
            "Reference (default configuration) acc_loss: %.4f lat_diff: %.4f",
            reference.acc_loss,
            reference.lat_diff,
        )

    def _values(self, acc_loss: float, lat_diff: float, loss: float) -> list[float]:
        """The objective values of a result: POT's loss, or ``(acc_loss, lat_diff)`` in Pareto mode."""
        return [acc_loss, lat_diff] if self.objective_mode == "pareto" else [loss]

    def _constraints(self, measurement: Measurement) -> dict[str, float]:
        return self.targets.constraints(measurement.acc_loss, measurement.lat_diff)

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        study = trial.study
        self.prepare(study)
        params = self.space.suggest(trial)
        total = "?" if self.max_trials is None else self.max_trials
        _logger.info("Trial iteration start: %d / %s", trial.number + 1, total)
        previous, seen = self._claim(study, trial, params)
        if previous is not None:
            for key, value in previous.user_attrs.items():
                # The result is copied, not who measured it nor the reference flag.
                if key not in (WORKER_KEY, REFERENCE_KEY):
                    trial.set_user_attr(key, value)
            trial.set_user_attr("duplicate_of", previous.number)
            for key, value in previous.constraints.items():
                trial.set_constraint(key, value)
            _logger.info(
                "Params already evaluated. Returning previous result: acc_loss: %.4f lat_diff: %.4f",
                previous.user_attrs["acc_loss"],
                previous.user_attrs["lat_diff"],
            )
            self._log_end(seen, trial.number, total)
            return list(previous.values) if self.objective_mode == "pareto" else float(previous.value)
        self._prune_if_target_reached(study)
        try:
            measurement = self.measure(params)
        except Exception as err:
            # Optuna records a failed trial without its reason; keep it where the dashboard shows it.
            trial.set_user_attr("fail_reason", f"{type(err).__name__}: {err}")
            raise
        self._prune_if_target_reached(study)
        loss = self.loss(measurement)
        for key, value in {**measurement.user_attrs(), "loss": loss}.items():
            trial.set_user_attr(key, value)
        for key, value in self._constraints(measurement).items():
            trial.set_constraint(key, value)
        _logger.info(
            "Current iteration acc_loss: %.4f lat_diff: %.4f exec_time: %.4f",
            measurement.acc_loss,
            measurement.lat_diff,
            (time.perf_counter() - self.started) / 60,
        )
        self._log_end(seen, trial.number, total, (measurement.acc_loss, measurement.lat_diff, loss))
        values = self._values(measurement.acc_loss, measurement.lat_diff, loss)
        return values if self.objective_mode == "pareto" else values[0]

    def _claim(
        self, study: optuna.Study, trial: optuna.Trial, params: Mapping[str, Any]
    ) -> tuple[FrozenTrial | None, list[FrozenTrial]]:
        """The trial that measured ``params`` already, or ``None`` once ``trial`` claimed them.

        A configuration that another running trial is measuring is waited for, so that no two
        workers measure it twice; if that trial fails or its worker dies, this one measures it.

        Returns:
            That trial or ``None``, and the complete and running trials read to decide, which
            the trial's last log line reuses.
        """
        watch = ClaimWatch(self.wait_timeout)
        while True:
            with self.lock():
                measuring = None
                seen = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
                for other in seen:
                    if other.number == trial.number or other.params != params:
                        continue
                    if other.state == TrialState.COMPLETE and "acc_loss" in other.user_attrs:
                        return other, seen
                    if other.state == TrialState.RUNNING and WORKER_KEY in other.user_attrs:
                        measuring = other
                if measuring is None:
                    trial.set_user_attr(WORKER_KEY, WORKER)
                    return None, seen
            # Fail the trial of a dead worker (if the storage runs a heartbeat) so the wait ends.
            with optuna_warnings_off():
                optuna.storages.fail_stale_trials(study)
            watch.wait(f"trial {measuring.number} of worker {measuring.user_attrs[WORKER_KEY]}")

    def _prune_if_target_reached(self, study: optuna.Study) -> None:
        if self.stop_on_target:
            number = target_reached(study)
            if number is not None:
                raise optuna.TrialPruned(f"Trial {number} already met both targets.")

    def _log_end(
        self,
        seen: list[FrozenTrial],
        number: int,
        total: object,
        current: tuple[float, float, float] | None = None,
    ) -> None:
        # ``seen`` is what _claim read before measuring. A trial that another worker finished
        # meanwhile is missing, which is fine for a log line and spares reading every trial again.
        trials = recorded(seen)
        results = [result_of(t) for t in trials] + ([] if current is None else [Result(*current)])
        index = best_index(results, self.targets)
        if index is not None:
            _logger.info(
                "Trial iteration end: %d / %s acc_loss: %.4f lat_diff: %.4f",
                number + 1,
                total,
                results[index].acc_loss,
                results[index].lat_diff,
            )
