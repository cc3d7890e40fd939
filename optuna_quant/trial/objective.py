"""One trial: parameters -> int8 model -> accuracy and latency -> POT's weighted loss.

:class:`QuantizationObjective` is a plain Optuna objective: it works with the study that
:func:`optuna_quant.create_study` builds and with any study a user builds. It turns a trial's
parameters into a configuration of its search space and has the
:class:`~optuna_quant.measure.measurer.Measurer` measure it; the reference that scales the loss
is :mod:`optuna_quant.trial.reference`, the stored records :mod:`optuna_quant.trial.records`.
A configuration that a trial measured already is not measured again: the trial copies that
result. One that a running trial claimed is waited for, then copied
(:mod:`optuna_quant.trial.claim`). A configuration that fails has its choices measured alone, and
those that fail alone are dropped from the study (:mod:`optuna_quant.trial.failures`).

Example:
    >>> objective = QuantizationObjective("model.onnx", calib, eval_fn)   # doctest: +SKIP
    >>> study = optuna.create_study()                                       # doctest: +SKIP
    >>> study.optimize(objective, n_trials=50)                              # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
import logging
import time
from typing import Any

import onnx
import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.measure.evaluate import EvalFn
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.loss import best_index
from optuna_quant.measure.loss import LossScaling
from optuna_quant.measure.loss import Result
from optuna_quant.measure.loss import Targets
from optuna_quant.measure.loss import weighted_loss
from optuna_quant.measure.measurer import Measurement
from optuna_quant.measure.measurer import Measurer
from optuna_quant.quantization.model_io import ModelLike
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.lock import ClaimLocks
from optuna_quant.storages.lock import StudyLock
from optuna_quant.trial import failures
from optuna_quant.trial import records
from optuna_quant.trial.budget import SENSITIVITY_SHARE
from optuna_quant.trial.claim import claim
from optuna_quant.trial.guidance import set_prior as guide_prior
from optuna_quant.trial.recipes import recipe_limit
from optuna_quant.trial.recipes import recipe_params
from optuna_quant.trial.reference import measure_reference
from optuna_quant.trial.reference import ReferenceMeasurementError
from optuna_quant.trial.reference import store_reference
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.results import recorded
from optuna_quant.trial.results import result_of
from optuna_quant.trial.space import SCOPES
from optuna_quant.trial.space import SearchSpace
from optuna_quant.trial.stopping import target_reached


_logger = logging.getLogger("optuna_quant")

OBJECTIVE_MODES = ("loss", "pareto")


@dataclass(frozen=True)
class TrialSettings:
    """How trials run, shared by the objective and the worker loop that feeds it.

    Attributes:
        stop_on_target: Stop once a trial met both targets: the worker starts no trial after it,
            the objective prunes a running one before measuring.
        objective_mode: ``"loss"`` returns POT's loss (minimise); ``"pareto"`` returns
            ``(acc_loss, lat_diff)`` for a study with directions ``["minimize", "maximize"]``.
        guided: Once the reference and the recipes ran, measure the sensitivity once, give the
            samplers its prior and queue start-up trials (:mod:`optuna_quant.study.guiding`).
        sensitivity_share: The share of the study's time the sensitivity may take
            (:mod:`optuna_quant.trial.budget`); ``None``: all of it, whatever it costs.
        recipes: Queue the simple recipes (:mod:`optuna_quant.trial.recipes`) right after the
            reference.
        prune: Report each timing block's loss and stop the timing when the study's pruner says
            so (:class:`optuna_quant.pruners.LatencyPruner`); stop an evaluation by samples once
            a model within the accuracy target exists and this one is confidently over it
            (:mod:`optuna_quant.measure.paired`). The trial is then recorded as pruned, with
            what it measured. Only in ``"loss"`` mode: Optuna prunes no trial of a
            multi-objective study.
    """

    stop_on_target: bool = False
    objective_mode: str = "loss"
    guided: bool = False
    sensitivity_share: float | None = SENSITIVITY_SHARE
    recipes: bool = False
    prune: bool = False

    def __post_init__(self) -> None:
        if self.objective_mode not in OBJECTIVE_MODES:
            raise ValueError(f"Unknown objective_mode {self.objective_mode!r}; choose from {OBJECTIVE_MODES}.")
        if self.prune and self.objective_mode != "loss":
            raise ValueError(f"prune needs objective_mode 'loss': Optuna prunes no {self.objective_mode!r} trial.")
        if self.sensitivity_share is not None and not 0 < self.sensitivity_share <= 1:
            raise ValueError(f"sensitivity_share must be in (0, 1], got {self.sensitivity_share!r}.")


class QuantizationObjective:
    """The Optuna objective that tunes int8 quantization of one model.

    ``model``, ``calibration_data``, ``eval_fn``, ``benchmark``, ``fp32_accuracy``,
    ``eval_subset_size``, ``pre_process``, ``latency_data`` and ``fp32_alongside`` go to the
    :class:`~optuna_quant.measure.measurer.Measurer`, which documents them.

    Args:
        targets: The accuracy and latency targets and loss weights.
        scopes: The tuning scopes that vary (see :mod:`optuna_quant.trial.space`).
        nodes: Restrict the ``layer`` scope to these node names (default: every quantizable node).
        layer_groups: ``"block"`` or ``"role"``: one ``layer`` parameter per group of a
            transformer's layers (:mod:`optuna_quant.quantization.groups`); ``None``: one per node.
        module_of_node: The module name of each node of a ``torch.nn.Module`` export, which the
            groups are read from where it names them.
        space: A ready search space; overrides ``scopes`` and ``nodes``.
        stop_on_target: Prune a running trial once another trial has met both targets.
        objective_mode: ``"loss"`` or ``"pareto"`` (:class:`TrialSettings`).
        lock: The lock every worker of the study shares; none needed for a single process.
        claim_locks: The lock of each configuration (:func:`optuna_quant.storages.lock.claim_locks`);
            ``lock`` for every configuration if ``None``.
        heartbeat: This worker's heartbeat, which ends a wait on a dead worker's trial; none
            needed for a single process.
        guided: Measure the sensitivity after the reference and the recipes
            (:class:`TrialSettings`); ``create_study`` sets it.
        sensitivity_share: The share of the study's time the sensitivity may take
            (:class:`TrialSettings`).
        recipes: Queue the simple recipes after the reference (:class:`TrialSettings`);
            ``create_study`` sets it.
        prune: Report each timing block to the study's pruner, which may stop the timing, and
            stop an evaluation by samples confidently over the accuracy target
            (:class:`TrialSettings`); ``create_study`` sets it.

    Attributes:
        measurer: Builds and measures the configurations, with no Optuna.
        space: The search space.
        settings: How trials run.
        scaling: The loss scaling, once the reference is known in this process.

    Raises:
        FileNotFoundError, TypeError, ValueError: Those of the ``Measurer``, before any trial runs.
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
        claim_locks: ClaimLocks | None = None,
        heartbeat: Heartbeat | None = None,
        pre_process: bool | str = True,
        guided: bool = False,
        sensitivity_share: float | None = SENSITIVITY_SHARE,
        recipes: bool = False,
        prune: bool = False,
        latency_data: Any = None,
        layer_groups: str | None = None,
        module_of_node: Mapping[str, str] | None = None,
        fp32_alongside: bool = False,
    ) -> None:
        self.settings = TrialSettings(
            stop_on_target=stop_on_target,
            objective_mode=objective_mode,
            guided=guided,
            sensitivity_share=sensitivity_share,
            recipes=recipes,
            prune=prune,
        )
        self.measurer = Measurer(
            model,
            calibration_data,
            eval_fn,
            benchmark=benchmark,
            fp32_accuracy=fp32_accuracy,
            eval_subset_size=eval_subset_size,
            pre_process=pre_process,
            latency_data=latency_data,
            fp32_alongside=fp32_alongside,
        )
        self.space = space or SearchSpace.from_model(
            self.measurer.prepared.prepared,
            scopes=scopes,
            nodes=nodes,
            layer_groups=layer_groups,
            module_of_node=module_of_node,
            int8_class=self.measurer.cpu.int8_class,
        )
        self.targets = targets or Targets()
        self.lock: StudyLock = lock or nullcontext
        self.claim_locks: ClaimLocks = claim_locks or (lambda key: self.lock)
        self.heartbeat = heartbeat
        self.scaling: LossScaling | None = None
        self.started = time.perf_counter()

    def build(self, params: Mapping[str, Any]) -> onnx.ModelProto:
        """The int8 model of the configuration ``params``, from cached calibration.

        Raises:
            ValueError: If ``params`` do not describe a configuration of the space.
        """
        return self.measurer.build(self.space.to_config(params))

    def accuracy(self, params: Mapping[str, Any]) -> float:
        """The int8 score of the configuration ``params``, without timing it."""
        return self.measurer.accuracy(self.space.to_config(params))

    def measure(self, params: Mapping[str, Any]) -> Measurement:
        """Build, evaluate and time the configuration ``params`` (no study needed).

        Raises:
            ValueError: If ``params`` do not describe a configuration of the space.
            RuntimeError: If ``eval_fn`` raises or returns something other than a finite number.
        """
        return self.measurer.measure(self.space.to_config(params))

    def measure_model(self, int8_model: onnx.ModelProto, *, quantize_seconds: float = 0.0) -> Measurement:
        """Evaluate and time a ready int8 model, such as a QAT export, exactly as a configuration
        is (:meth:`~optuna_quant.measure.measurer.Measurer.measure_model`); :meth:`loss` scores it.

        Example:
            >>> qat_onnx = export_qat(qat, torch.zeros(1, 1, 28, 28))   # doctest: +SKIP
            >>> objective.measure_model(qat_onnx).acc_loss              # doctest: +SKIP
        """
        return self.measurer.measure_model(int8_model, quantize_seconds=quantize_seconds)

    def baseline(self) -> float:
        """The fp32 accuracy: from ``metrics``, or measured once (the measurer's)."""
        return self.measurer.baseline()

    def loss(self, measurement: Measurement) -> float:
        """POT's weighted loss of ``measurement`` under the study's scaling."""
        return self._loss_of(measurement.acc_loss, measurement.lat_diff, measurement.quantized)

    def _loss_of(self, acc_loss: float, lat_diff: float, quantized: bool) -> float:
        if self.scaling is None:
            raise RuntimeError("The loss scaling is not set yet: the reference trial has not run.")
        return weighted_loss(acc_loss, lat_diff, self.targets, self.scaling, quantized)

    def _accuracy_watch(self, seen: list[FrozenTrial]) -> Callable[[float], bool] | None:
        """Stop an evaluation confidently over the accuracy target, once a model within it exists
        (before, the model closest to the target is the best, and each needs its whole score)."""
        if not self.settings.prune:
            return None
        best = best_trial(seen, self.targets)
        if best is None or not records.quantized(best) or not self.targets.accuracy_met(records.acc_loss(best)):
            return None
        return lambda bound: bound > self.targets.acc_th

    def values(self, acc_loss: float, lat_diff: float, loss: float) -> float | list[float]:
        """The objective value(s) of a result: POT's loss, or ``[acc_loss, lat_diff]`` in Pareto mode."""
        return [acc_loss, lat_diff] if self.settings.objective_mode == "pareto" else loss

    def record(self, trial: optuna.Trial, measurement: Measurement, loss: float) -> None:
        """Record ``measurement`` and its loss on ``trial``."""
        attrs = {**measurement.user_attrs(), records.LOSS_KEY: loss}
        records.record_result(trial, attrs, self._constraints(measurement))

    def _constraints(self, measurement: Measurement) -> dict[str, float]:
        return self.targets.constraints(measurement.acc_loss, measurement.lat_diff, measurement.quantized)

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        return self.run(trial)

    def run(self, trial: optuna.Trial, max_trials: int | None = None) -> float | list[float]:
        """Measure ``trial``'s configuration, or copy the result of a trial that measured it.

        Args:
            trial: The trial.
            max_trials: The study's budget, for the log lines and the start-up trials.
        """
        study = trial.study
        records.start_trial(trial, self.measurer.cpu.int8_class, self.measurer.cpu.onnxruntime_version)
        if records.is_reference(trial):
            if records.reference_scaling(study) is None:
                return self._run_reference(trial, max_trials)
            # A queued reference whose scaling another trial stored: an ordinary repeat of it.
            records.unmark_reference(trial)
        self._ensure_scaling(study)
        params = self.space.suggest(trial)
        total = "?" if max_trials is None else max_trials
        _logger.info("Trial iteration start: %d / %s", trial.number, total)
        forbidden = failures.forbidden_in(study, params)
        if forbidden is not None:  # drawn by a sampler that does not read the study's prior
            error = failures.ForbiddenChoiceError(forbidden)
            records.record_failure(trial, error)
            raise error
        previous, seen = claim(study, trial, params, self.space, self.claim_locks, self.lock, self.heartbeat)
        if previous is not None:
            records.copy_result(trial, previous)
            _logger.info(
                "Params already evaluated. Returning previous result: acc_loss: %.4f lat_diff: %.4f",
                records.acc_loss(previous),
                records.lat_diff(previous),
            )
            self._log_end(seen, trial.number, total)
            if previous.state == TrialState.PRUNED:  # the bar only rises: it would be pruned again
                trial.report(float(previous.value), 0)
                raise optuna.TrialPruned(f"Trial {previous.number} measured the same configuration and was pruned.")
            return list(previous.values) if self.settings.objective_mode == "pareto" else float(previous.value)
        if self.settings.stop_on_target:
            number = target_reached(seen, self.targets)
            if number is not None:
                raise optuna.TrialPruned(f"Trial {number} already met both targets.")
        reports = _BlockReports(trial, self._loss_of) if self.settings.prune else None
        try:
            measurement = self.measurer.measure(self.space.to_config(params), reports, self._accuracy_watch(seen))
        except Exception as err:
            records.record_failure(trial, err)
            self._learn(study, params, trial.number)
            raise
        loss = self.loss(measurement)
        self.record(trial, measurement, loss)
        reasons = _pruned_reasons(measurement)
        if reports is not None and reasons:
            reports.report(loss)  # the value Optuna keeps for the pruned trial: its loss so far
            records.record_pruned(trial, "; ".join(reasons))
            raise optuna.TrialPruned(f"Its model is {'; '.join(reasons)}.")
        _logger.info(
            "Current iteration acc_loss: %.4f lat_diff: %.4f exec_time: %.2f min",
            measurement.acc_loss,
            measurement.lat_diff,
            (time.perf_counter() - self.started) / 60,
        )
        result = Result(measurement.acc_loss, measurement.lat_diff, loss, measurement.quantized)
        self._log_end(seen, trial.number, total, result)
        return self.values(measurement.acc_loss, measurement.lat_diff, loss)

    def _learn(self, study: optuna.Study, params: Mapping[str, Any], number: int) -> None:
        """Find which choices of the failed ``params`` fail alone, and have the study drop them."""
        found = failures.culprits(self.measurer, self.space, params, number)
        if failures.forbid(study, self.lock, found):  # this process's sampler at once; others before their next trial
            guide_prior(study.sampler, study, self.targets, self.space, self.settings.guided)

    def _run_reference(self, trial: optuna.Trial, max_trials: int | None) -> float | list[float]:
        """Measure the reference as ``trial`` (a queued reference trial) and store its scaling once."""
        params = self.space.suggest(trial)
        try:
            measurement, scaling = measure_reference(self.measurer, self.space.to_config(params), self.targets)
        except ReferenceMeasurementError as err:
            records.record_failure(trial, err)
            raise
        if self.settings.recipes:
            # Before the scaling is stored, which the other workers wait for: they start on them.
            with self.lock():
                records.enqueue_recipes(trial.study, recipe_params(self.space, recipe_limit(max_trials)))
        self._adopt(store_reference(trial.study, self.lock, self.measurer.baseline(), measurement, scaling))
        loss = self.loss(measurement)
        self.record(trial, measurement, loss)
        return self.values(measurement.acc_loss, measurement.lat_diff, loss)

    def _ensure_scaling(self, study: optuna.Study) -> None:
        """Take the study's scaling, measuring the reference here if the study has none.

        A worker loop runs no trial before its reference trial completed; a plain Optuna study,
        fed by one process, gets its reference recorded as an extra trial before its first one.
        """
        if self.scaling is not None:
            return
        stored = records.reference_scaling(study)
        if stored is not None:
            self._adopt(stored)
            return
        params = self.space.default_params()
        measurement, scaling = measure_reference(self.measurer, self.space.to_config(params), self.targets)
        self._adopt(store_reference(study, self.lock, self.measurer.baseline(), measurement, scaling))
        loss = self.loss(measurement)
        values = self.values(measurement.acc_loss, measurement.lat_diff, loss)
        records.reference_trial(
            study,
            params,
            self.space.distributions(),
            values if isinstance(values, list) else [values],
            {**measurement.user_attrs(), records.LOSS_KEY: loss},
            self._constraints(measurement),
        )

    def _adopt(self, stored: tuple[float, LossScaling]) -> None:
        fp32_accuracy, self.scaling = stored
        self.measurer.adopt_baseline(fp32_accuracy)

    def _log_end(self, seen: list[FrozenTrial], number: int, total: object, current: Result | None = None) -> None:
        # ``seen`` was read before measuring: a trial another worker finished meanwhile is missing,
        # which a log line can afford. This trial is not recorded there yet: it counts as ``current``.
        results = [result_of(t) for t in recorded(seen)] + ([] if current is None else [current])
        best = results[best_index(results, self.targets)]  # type: ignore[index]
        _logger.info(
            "Trial iteration end: %d / %s acc_loss: %.4f lat_diff: %.4f", number, total, best.acc_loss, best.lat_diff
        )


def _pruned_reasons(measurement: Measurement) -> list[str]:
    """Why a measurement stopped early, one phrase a watcher that stopped it."""
    reasons = []
    if measurement.eval_samples is not None:
        reasons.append(
            f"over the accuracy target on its first {measurement.eval_samples} samples "
            f"(acc_loss {measurement.acc_loss:.4f} there)"
        )
    if measurement.latency.stopped:
        reasons.append(
            f"slower than the best model within target in each of the {measurement.latency.blocks} "
            f"timing blocks run (lat_diff {measurement.lat_diff:.4f}, acc_loss {measurement.acc_loss:.4f})"
        )
    return reasons


class _BlockReports:
    """Reports each timing block's loss as the trial's next intermediate value and asks the
    study's pruner whether to stop (a :data:`~optuna_quant.measure.measurer.TimingWatch`)."""

    def __init__(self, trial: optuna.Trial, loss_of: Callable[[float, float, bool], float]) -> None:
        self.trial = trial
        self.loss_of = loss_of
        self.steps = 0

    def __call__(self, acc_loss: float, lat_diff: float, quantized: bool) -> bool:
        self.report(self.loss_of(acc_loss, lat_diff, quantized))
        return self.trial.should_prune()

    def report(self, value: float) -> None:
        """Report ``value`` at the next step."""
        self.trial.report(value, self.steps)
        self.steps += 1
