"""Why int8 is no faster than fp32 on a model and a CPU: the usual causes, those found first.

Read from the graph (operators without int8 kernels between int8 ones, unfolded BatchNorm, narrow
layers, attention and its mask path, the approach's conversions), the CPU's int8 class
(:mod:`optuna_quant.measure.cpu`) and, where given, onnxruntime's profile of the int8 model per
operator type; the probe reports them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from collections.abc import Mapping

import onnx
from onnxruntime.quantization.registry import QLinearOpsRegistry

from optuna_quant.measure.cpu import Int8Support
from optuna_quant.quantization.config import QUANTIZABLE_OP_TYPES


NARROW_CHANNELS = 64
"""Layers narrower than this rarely run faster in int8 than in fp32."""
# Ops that move or reshape data: no arithmetic, so no int8 kernel is needed.
_DATA_OPS = frozenset({"Constant", "Shape", "Identity", "Cast", "Slice", "Expand", "Tile", "Gather",
                       "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Concat",
                       "Range", "GatherND", "ScatterND"})
# Fused attention, as onnxruntime's transformer optimizer writes it.
_ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "QAttention"})
# What onnxruntime runs in int8, and its conversions between fp32 and int8, in the graph it runs.
INT8_KERNELS = frozenset({"QLinearMatMul", "QLinearConv", "QGemm", "MatMulInteger", "MatMulIntegerToFloat",
                          "DynamicQuantizeMatMul", "ConvInteger", "QAttention", "DynamicQuantizeLSTM"})
_CONVERSIONS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
NOT_THE_CAUSE = "(not the cause here)"
"""The start of a cause of :func:`slow_int8_causes` that this model and CPU do not have."""


def quantizes_anything(model: onnx.ModelProto, fp32_nodes: Counter[str] | None = None) -> bool:
    """Whether ``model`` runs anything in int8 beyond ``fp32_nodes``, the :func:`int8_nodes` of the
    model it was built from: a quantized kernel or a conversion to or from int8 of a type that
    model holds fewer of (any, without ``fp32_nodes``).

    A configuration that keeps every quantizable node in fp32 builds the fp32 model again; a
    model that already holds Q/DQ pairs (a QAT export) holds them in that configuration too.
    """
    return bool(int8_nodes(model) - (fp32_nodes or Counter()))


def int8_nodes(model: onnx.ModelProto) -> Counter[str]:
    """How many int8 kernels and int8 conversions of each operator type ``model`` holds."""
    return Counter(node.op_type for node in model.graph.node if node.op_type in INT8_KERNELS | _CONVERSIONS)


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
    not_fp32 = _DATA_OPS | INT8_KERNELS | _CONVERSIONS | {*QUANTIZABLE_OP_TYPES, "FusedMatMul"}
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
