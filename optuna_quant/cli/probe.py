"""What to ask for before a study: the fp32 model, the reference int8 model and this CPU, measured.

A probe measures the fp32 accuracy and latency and the reference configuration (every layer
int8, the first choice of every scope: the configuration a study's first trial measures), reads
what this CPU and onnxruntime offer for int8, and suggests a pair of targets with its reason. When
int8 is not faster than fp32 here it says so, with the usual causes found in the model (for a
transformer: what stays fp32 between its int8 MatMuls, attention and its mask path, the
approach's conversions, fusion, each with its measured share of the int8 model's time). It takes
seconds to a minute and touches no storage: no study is created or read.

Example:
    >>> import optuna_quant as oq
    >>> report = oq.probe.probe("model.onnx", calib, eval_fn=evaluate)   # doctest: +SKIP
    >>> print(report.report())                                          # doctest: +SKIP
    >>> report.suggested_latency_reduce                                 # doctest: +SKIP
    2.05
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
import math
import time
from typing import Any

from optuna_quant.logs import quiet_onnxruntime
from optuna_quant.measure.cpu import Int8Support
from optuna_quant.measure.evaluate import eval_function
from optuna_quant.measure.evaluate import EvalFn
from optuna_quant.measure.int8_causes import is_transformer
from optuna_quant.measure.int8_causes import NOT_THE_CAUSE
from optuna_quant.measure.int8_causes import slow_int8_causes
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.profile import profile_op_types
from optuna_quant.quantization.model_io import ModelLike
from optuna_quant.trial.objective import Measurement
from optuna_quant.trial.objective import QuantizationObjective


SensitivityMap = Mapping[str, Mapping[str, float]]
"""Per-layer sensitivity: ``{node: {"acc_cost": float, "time_saved_ms": float}}``."""


@dataclass(frozen=True)
class ProbeReport:
    """What a probe measured and what it suggests.

    Attributes:
        fp32_accuracy: The fp32 model's score.
        reference: The measurement of the reference configuration (``space.default_params()``),
            the one a study's first trial records.
        support: What this machine offers for int8.
        suggested_accuracy_loss: Suggested ``accuracy_loss``, percent.
        suggested_latency_reduce: Suggested ``latency_reduce``.
        reasons: Why, one sentence per target.
        slow_int8_causes: What makes int8 no faster than fp32, those found in this model and on
            this CPU first (the others start with :data:`NOT_THE_CAUSE`); shown as the usual
            causes when int8 is not faster here, as what limits its speed-up (those found) when
            it is.
        sensitivity: Per-layer sensitivity, when known.
        seconds: How long the probe took.
    """

    fp32_accuracy: float
    reference: Measurement
    support: Int8Support
    suggested_accuracy_loss: float
    suggested_latency_reduce: float
    reasons: tuple[str, str]
    slow_int8_causes: tuple[str, ...]
    sensitivity: SensitivityMap | None
    seconds: float

    @property
    def acc_loss(self) -> float:
        """The reference's relative accuracy loss."""
        return self.reference.acc_loss

    @property
    def lat_diff(self) -> float:
        """The reference's ``fp32_latency / int8_latency``."""
        return self.reference.lat_diff

    @property
    def found_causes(self) -> tuple[str, ...]:
        """The causes of :attr:`slow_int8_causes` found in this model and on this CPU."""
        return tuple(cause for cause in self.slow_int8_causes if not cause.startswith(NOT_THE_CAUSE))

    @property
    def int8_faster(self) -> bool:
        """Whether the reference int8 model runs faster than fp32 here."""
        return self.lat_diff > 1.0

    def report(self) -> str:
        """The probe as a person reads it, with units on every figure."""
        latency = self.reference.latency
        lines = [
            f"Probe ({self.seconds:.1f} s, nothing stored)",
            f"  fp32 model:        accuracy {self.fp32_accuracy:.4f}, latency {latency.fp32_ms:.3f} ms per run",
            f"  reference int8:    acc_loss {self.acc_loss:.4f} ({self.acc_loss * 100:.2f} % of fp32 accuracy), "
            f"lat_diff {self.lat_diff:.2f}x ± {latency.spread * 100:.1f} % ({latency.int8_ms:.3f} ms per run)",
            "                     (every layer int8, the first choice of every scope: a study's first trial)",
            f"  timed on:          {latency.feed}",
            f"  int8 on this CPU:  {self.support.describe()}",
        ]
        if not self.int8_faster:
            lines.append(f"  int8 is not faster than fp32 here (lat_diff {self.lat_diff:.2f}x). Usual causes:")
            lines += [f"    - {cause}" for cause in self.slow_int8_causes]
        elif self.found_causes:
            lines.append("  what limits the speed-up of int8 here:")
            lines += [f"    - {cause}" for cause in self.found_causes]
        if self.sensitivity:
            lines.append("  most sensitive layers (accuracy cost of int8, time it saves):")
            lines += [
                f"    {node:24s} acc_cost {cost['acc_cost']:.4f}  time_saved {cost['time_saved_ms']:.3f} ms"
                for node, cost in _most_sensitive(self.sensitivity)
            ]
        lines += [
            "Suggested targets (config keys):",
            f"  accuracy_loss: {self.suggested_accuracy_loss:.1f}     # percent: {self.reasons[0]}",
            f"  latency_reduce: {self.suggested_latency_reduce:.2f}   # {self.reasons[1]}",
        ]
        return "\n".join(lines)


def _most_sensitive(sensitivity: SensitivityMap, n: int = 5) -> list[tuple[str, Mapping[str, float]]]:
    return sorted(sensitivity.items(), key=lambda item: -item[1]["acc_cost"])[:n]


def suggest_targets(acc_loss: float, lat_diff: float, spread: float) -> tuple[float, float, tuple[str, str]]:
    """A pair of targets for a study, from the reference's ``acc_loss``, ``lat_diff`` and spread.

    The latency target is a little under the reference's speed-up (by twice its spread, at least
    5 %, rounded down to 0.05), as the reference, every layer int8, is about the fastest
    configuration and keeping a few layers in fp32 costs some speed. The accuracy target is 1 %,
    POT's usual one.

    Returns:
        ``(accuracy_loss, latency_reduce, (accuracy reason, latency reason))``.

    Example:
        >>> suggest_targets(0.0674, 2.18, 0.015)[:2]
        (1.0, 2.05)
        >>> suggest_targets(0.002, 0.85, 0.02)[:2]
        (1.0, 1.0)
    """
    percent = acc_loss * 100
    if percent <= 1.0:
        accuracy = (
            f"the reference loses {percent:.2f} %, within 1 %: the search can look for faster "
            "calibration and granularity choices"
        )
    else:
        accuracy = (
            f"the reference loses {percent:.2f} %: the search keeps the most sensitive layers in fp32 "
            f"to get under 1 %, at some speed; ask for {math.ceil(percent * 10) / 10:g} if that loss is acceptable"
        )
    if lat_diff <= 1.0:
        return 1.0, 1.0, (accuracy, f"int8 is not faster than fp32 here (lat_diff {lat_diff:.2f}x): ask for no speed-up")
    margin = max(0.05, 2 * spread)
    latency_reduce = max(1.0, math.floor(lat_diff * (1 - margin) * 20) / 20)
    latency = (
        f"a little under the reference's {lat_diff:.2f}x (spread {spread * 100:.1f} %), "
        "so that a few layers can stay in fp32 and still meet it"
    )
    return 1.0, latency_reduce, (accuracy, latency)


def run_probe(objective: QuantizationObjective, sensitivity: SensitivityMap | None = None) -> ProbeReport:
    """Probe the model of ``objective``: fp32 baseline, reference configuration, CPU, targets.

    The objective's fp32 accuracy is measured once and kept (or taken from its ``metrics``), so a
    study that uses the same objective does not evaluate fp32 again. Nothing is stored.

    Args:
        objective: The objective of the model, its data and latency settings.
        sensitivity: Per-layer sensitivity ``{node: {"acc_cost": ..., "time_saved_ms": ...}}``, shown
            when given.
    """
    start = time.perf_counter()
    with quiet_onnxruntime():
        fp32_accuracy = objective.baseline()
        reference = objective.measure(objective.space.default_params())
        support = objective.measurer.cpu
        causes = _causes(objective, support)
    accuracy_loss, latency_reduce, reasons = suggest_targets(
        reference.acc_loss, reference.lat_diff, reference.latency.spread
    )
    return ProbeReport(
        fp32_accuracy=fp32_accuracy,
        reference=reference,
        support=support,
        suggested_accuracy_loss=accuracy_loss,
        suggested_latency_reduce=latency_reduce,
        reasons=reasons,
        slow_int8_causes=causes,
        sensitivity=sensitivity,
        seconds=time.perf_counter() - start,
    )


PROFILE_RUNS = 20
"""Profiled runs of the reference int8 model of a transformer, for the measured causes."""


def _causes(objective: QuantizationObjective, support: Int8Support) -> tuple[str, ...]:
    """:func:`slow_int8_causes` of the objective's model; on a transformer with the reference int8
    model and its time per operator type, profiled on the latency feed."""
    measurer = objective.measurer
    if not is_transformer(measurer.prepared.prepared):
        return slow_int8_causes(measurer.model, support)
    int8_model = objective.build(objective.space.default_params())
    op_ms = profile_op_types(int8_model, measurer.latency_feed, measurer.benchmark, PROFILE_RUNS)
    return slow_int8_causes(measurer.model, support, int8_model, op_ms)


def probe(
    model: ModelLike,
    calibration_data: Iterable[Any],
    eval_fn: EvalFn | None = None,
    *,
    eval_data: tuple[Any, Any] | None = None,
    benchmark: BenchmarkSettings | dict[str, Any] | None = None,
    metrics: float | None = None,
    eval_subset_size: int | None = None,
    sensitivity: SensitivityMap | None = None,
    latency_data: Any = None,
) -> ProbeReport:
    """Probe ``model`` with the arguments of :func:`optuna_quant.create_study` that measuring needs.

    Raises:
        ValueError, TypeError, FileNotFoundError: For bad input, as ``create_study`` does.
    """
    eval_fn = eval_function(eval_fn, eval_data)
    if isinstance(benchmark, dict):
        benchmark = BenchmarkSettings.from_dict(benchmark)
    objective = QuantizationObjective(
        model,
        calibration_data,
        eval_fn,
        benchmark=benchmark,
        fp32_accuracy=metrics,
        eval_subset_size=eval_subset_size,
        latency_data=latency_data,
    )
    return run_probe(objective, sensitivity)
