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

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
import math
import time
from typing import Any

import onnx
from onnxruntime.quantization.registry import QLinearOpsRegistry

from optuna_quant.measure.cpu import Int8Support
from optuna_quant.measure.evaluate import eval_function
from optuna_quant.measure.evaluate import EvalFn
from optuna_quant.quantization.config import QUANTIZABLE_OP_TYPES
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.profile import profile_op_types
from optuna_quant.logs import quiet_onnxruntime
from optuna_quant.quantization.model_io import ModelLike
from optuna_quant.trial.objective import Measurement
from optuna_quant.trial.objective import QuantizationObjective

NARROW_CHANNELS = 64
"""Layers narrower than this rarely run faster in int8 than in fp32."""
# Ops that move or reshape data: no arithmetic, so no int8 kernel is needed.
_DATA_OPS = frozenset({"Constant", "Shape", "Identity", "Cast", "Slice", "Expand", "Tile", "Gather",
                       "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Concat",
                       "Range", "GatherND", "ScatterND"})
# Fused attention, as onnxruntime's transformer optimizer writes it.
_ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "QAttention"})
# What onnxruntime runs in int8, and its conversions between fp32 and int8, in the graph it runs.
_INT8_KERNELS = frozenset({"QLinearMatMul", "QLinearConv", "QGemm", "MatMulInteger", "MatMulIntegerToFloat",
                           "DynamicQuantizeMatMul", "ConvInteger", "QAttention", "DynamicQuantizeLSTM"})
_CONVERSIONS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
NOT_THE_CAUSE = "(not the cause here)"
"""The start of a cause of :func:`slow_int8_causes` that this model and CPU do not have."""
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


def slow_int8_causes(
    model: onnx.ModelProto,
    support: Int8Support,
    int8_model: onnx.ModelProto | None = None,
    op_ms: Mapping[str, float] | None = None,
) -> tuple[str, ...]:
    """What usually makes int8 no faster than fp32, the causes found in ``model`` and ``support`` first.

    Args:
        model: The fp32 model that is quantized (the prepared one).
        support: What the CPU offers for int8.
        int8_model: The reference int8 model; on a transformer it tells the approach and the
            MatMuls left in fp32.
        op_ms: The reference int8 model's node time per operator type of the graph onnxruntime
            runs (:func:`~optuna_quant.measure.profile.profile_op_types`), to put a measured
            share beside the transformer causes.
    """
    found, other = [], []
    if support.dot_product:
        other.append("no int8 dot-product instructions (VNNI, AMX): this CPU has them")
    else:
        found.append("this CPU has no int8 dot-product instructions (AVX512-VNNI, AVX-VNNI, AMX): "
                     "onnxruntime's int8 kernels gain little over fp32")
    counts = Counter(node.op_type for node in model.graph.node)
    batch_norms = counts.get("BatchNormalization", 0)
    (found if batch_norms else other).append(
        f"unfolded BatchNormalization ({batch_norms} in this model): fold them first "
        "(onnxruntime.quantization.shape_inference.quant_pre_process)"
    )
    if is_transformer(model):
        _transformer_causes(model, int8_model or model, op_ms or {}, found, other)
    else:
        no_kernel = {op: n for op, n in counts.items() if op not in QLinearOpsRegistry and op not in _DATA_OPS}
        if no_kernel:
            found.append(f"Q/DQ pairs around ops without int8 kernels, which run in fp32 between int8 layers: {_counted(no_kernel)}")
        else:
            other.append("Q/DQ pairs around ops without int8 kernels: none in this model")
    widest = _widest_layer(model)
    if widest is not None and widest < NARROW_CHANNELS:
        found.append(f"narrow layers: the widest has {widest} output channels; int8 pays from about "
                     f"{NARROW_CHANNELS} channels")
    else:
        other.append(f"layers too narrow (under {NARROW_CHANNELS} channels): the widest has {widest}")
    return tuple(found + [f"{NOT_THE_CAUSE} {cause}" for cause in other])


def _counted(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{op} ({n})" for op, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def activation_matmuls(model: onnx.ModelProto) -> tuple[str, ...]:
    """The MatMuls of two activations (attention's ``Q K^T`` and ``probabilities V``): static Q/DQ
    quantizes them, the dynamic approach leaves them fp32."""
    constants = {init.name for init in model.graph.initializer}
    constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    return tuple(
        node.name for node in model.graph.node
        if node.op_type == "MatMul" and not constants & set(node.input[:2])
    )


def _fp32_matmuls(int8_model: onnx.ModelProto, names: Iterable[str]) -> tuple[str, ...]:
    """Those of the MatMuls ``names`` that run in fp32 in ``int8_model``: still MatMuls, with an
    input that no DequantizeLinear gives."""
    dequantized = {out for node in int8_model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    wanted = set(names)
    return tuple(
        node.name for node in int8_model.graph.node
        if node.name in wanted and node.op_type == "MatMul" and not set(node.input[:2]) <= dequantized
    )


def is_transformer(model: onnx.ModelProto) -> bool:
    """Whether ``model`` has attention: a fused attention operator, or a Softmax beside MatMuls of
    two activations."""
    ops = {node.op_type for node in model.graph.node}
    return bool(ops & _ATTENTION_OPS) or ("Softmax" in ops and bool(activation_matmuls(model)))


def mask_path(model: onnx.ModelProto) -> tuple[str, ...]:
    """The nodes that carry an input named ``*mask*`` to the attention scores, up to and with
    each Softmax that takes it (where the mask is added as ``finfo.min``), in graph order."""
    reached = {value.name for value in model.graph.input if "mask" in value.name.lower()}
    path = []
    for node in model.graph.node:  # graph order is topological
        if reached & set(node.input):
            path.append(node.name)
            if node.op_type != "Softmax":
                reached.update(node.output)
    return tuple(path)


def _measured(op_ms: Mapping[str, float], op_types: Iterable[str]) -> str:
    """``"; measured: x ms of y ms per run (z %)"`` for the time of ``op_types``, or ``""``."""
    total = sum(op_ms.values())
    if not total:
        return ""
    ms = sum(op_ms.get(op, 0.0) for op in set(op_types))
    return f"; measured: {ms:.3f} ms of the int8 model's {total:.3f} ms per run ({ms / total:.0%})"


def _transformer_causes(
    model: onnx.ModelProto, int8_model: onnx.ModelProto, op_ms: Mapping[str, float], found: list[str], other: list[str]
) -> None:
    """The causes that a transformer adds: what stays fp32 between the int8 MatMuls, attention and
    its mask path, the cost of the approach's conversions, and fusion."""
    int8_ops = Counter(node.op_type for node in int8_model.graph.node)
    not_fp32 = _DATA_OPS | _INT8_KERNELS | _CONVERSIONS | {*QUANTIZABLE_OP_TYPES, "FusedMatMul"}
    fp32_ops = Counter(node.op_type for node in model.graph.node if node.op_type not in not_fp32)
    measured_fp32 = [op for op in op_ms if op not in not_fp32]
    found.append(
        "operators that run in fp32 between the int8 MatMuls, each with a conversion at its int8 "
        f"neighbours: {_counted(fp32_ops)}{_measured(op_ms, measured_fp32)}"
    )
    attention = activation_matmuls(model)
    fp32_attention = _fp32_matmuls(int8_model, attention)
    masked = set(mask_path(model))
    if fp32_attention or masked:
        found.append(
            f"attention in fp32: {len(fp32_attention)} of its {len(attention)} MatMuls of two activations "
            "(Q K^T, probabilities V)"
            + (f", and the attention-mask path ({len(masked)} nodes from the mask input to each Softmax: "
               f"{_counted(Counter(n.op_type for n in model.graph.node if n.name in masked))}), "
               "whose fill values (finfo.min) no int8 range holds" if masked else "")
            + _measured(op_ms, ("MatMul", "FusedMatMul"))
        )
    if int8_ops.get("DynamicQuantizeLinear"):
        found.append(
            f"the dynamic approach: {int8_ops['DynamicQuantizeLinear']} DynamicQuantizeLinear quantize "
            "the int8 MatMuls' inputs at run time, a pass over each activation per run (onnxruntime "
            "fuses those it can into DynamicQuantizeMatMul)"
            + _measured(op_ms, ("DynamicQuantizeLinear",))
        )
    elif int8_ops.get("QuantizeLinear") or int8_ops.get("DequantizeLinear"):
        found.append(
            f"the static approach: {int8_ops['QuantizeLinear']} QuantizeLinear and {int8_ops['DequantizeLinear']} "
            "DequantizeLinear convert between fp32 and int8 where onnxruntime cannot fuse them into its int8 kernels"
            + _measured(op_ms, ("QuantizeLinear", "DequantizeLinear"))
        )
    fused = ({node.op_type for node in model.graph.node} | set(op_ms)) & _ATTENTION_OPS
    if fused:
        other.append(f"unfused attention: this model runs {', '.join(sorted(fused))}")
    else:
        found.append(
            "attention not fused: each attention runs as separate Reshape, Transpose, MatMul and Softmax "
            "nodes; onnxruntime's Attention has an int8 kernel (QAttention), but its transformer optimizer "
            "(pre_process='transformer') fuses attention only in the patterns it knows, not the dynamo "
            "exporter's (docs/models.md)"
        )


def _widest_layer(model: onnx.ModelProto) -> int | None:
    """The most output channels of a Conv, ConvTranspose, MatMul or Gemm with a constant weight."""
    weights = {init.name: init for init in model.graph.initializer}
    widths = []
    for node in model.graph.node:
        if node.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm") and len(node.input) > 1:
            weight = weights.get(node.input[1])
            if weight is not None and len(weight.dims) >= 2:
                trans_b = any(a.name == "transB" and a.i for a in node.attribute)
                axis = {"Conv": 0, "ConvTranspose": 1, "MatMul": -1, "Gemm": 0 if trans_b else -1}[node.op_type]
                widths.append(int(weight.dims[axis]))
    return max(widths) if widths else None


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
