"""What one int8 configuration is, and which nodes of a graph can take one: no Optuna here.

:class:`QuantConfig` is what :mod:`optuna_quant.quantization.quantize` builds a model from; its
defaults are the static reference recipe, onnxruntime's recommended one (asymmetric uint8
activations, symmetric int8 weights, per channel, Q/DQ around the compute-heavy operators only).
Its ``approach`` chooses how: static Q/DQ from calibrated ranges, or dynamic
(:mod:`optuna_quant.quantization.dynamic`: weights int8 ahead of time, activations at run time),
which reads only the fallback, the granularity and the weights' mode (:func:`effective_config`).
The Optuna search space over it is :class:`optuna_quant.trial.space.SearchSpace`.

Example:
    >>> config = QuantConfig(fallback=frozenset({"fc"}), per_channel=False)
    >>> config.approach, config.range_estimator, config.op_types
    ('static', 'minmax', 'compute')
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import replace
import functools

import onnx

from optuna_quant.quantization.recovery import TRANSFORMS


QUANTIZABLE_OP_TYPES: tuple[str, ...] = ("Conv", "ConvTranspose", "MatMul", "Gemm")
OP_TYPE_SET_NAMES: tuple[str, ...] = ("compute", "qdq", "all")
"""The choices of operator types that get Q/DQ, reference first (:func:`op_type_sets`)."""
RANGE_ESTIMATORS: tuple[str, ...] = (
    "minmax",
    "entropy",
    "percentile_99.9",
    "percentile_99.99",
    "percentile_99.999",
)
APPROACHES: tuple[str, ...] = ("static", "dynamic")
"""How the int8 model is built: Q/DQ from calibrated ranges, or activations quantized at run time."""
DYNAMIC_OP_TYPES: tuple[str, ...] = ("MatMul", "Attention", "LSTM")
"""The operators the dynamic approach quantizes (MatMul only where its weights are constant):
those of onnxruntime's integer kernels that pay. Its ConvInteger ran slower than fp32 and its
quantized Gather and Transpose bought nothing on every model measured (docs/models.md)."""
GRANULARITIES: tuple[str, ...] = ("per_channel", "per_tensor")
ACTIVATION_MODES: tuple[str, ...] = ("asymmetric", "symmetric")
WEIGHT_MODES: tuple[str, ...] = ("symmetric", "asymmetric")
WEIGHT_TYPES: tuple[str, ...] = ("int8", "int7", "uint8")
"""How weights are stored, the reference first: int8; int7, onnxruntime's ``reduce_range`` (7-bit
int8 weights); uint8, which onnxruntime runs with its u8u8 kernels (:func:`weight_type_choices`)."""
SATURATING_INT8_CLASSES: frozenset[str] = frozenset({"x86-avx2", "x86-avx512"})
"""The CPU int8 classes (:mod:`optuna_quant.measure.cpu`) whose u8s8 kernels can saturate."""


@functools.cache
def op_type_sets() -> dict[str, tuple[str, ...]]:
    """The operator types of each of :data:`OP_TYPE_SET_NAMES`, from onnxruntime's registries.

    Read on first use, so that reading a stored study loads no onnxruntime.
    """
    from onnxruntime.quantization.registry import QDQRegistry
    from onnxruntime.quantization.registry import QLinearOpsRegistry

    return {
        # The reference: Q/DQ around the operators with fast int8 kernels, and the Relu/Clip that
        # onnxruntime folds into their output's range (left out, each would sit in fp32 between a
        # DequantizeLinear and a QuantizeLinear). Q/DQ around an operator without an int8 kernel
        # (HardSwish, Mul, an unfolded BatchNorm) adds conversions and no speed; docs/models.md
        # has the measurements that put this choice first.
        "compute": (*QUANTIZABLE_OP_TYPES, "Relu", "Clip"),
        # onnxruntime's QDQ registry: also Relu/Clip (removed when fused), pooling, data movement.
        "qdq": tuple(sorted(QDQRegistry)),
        # quantize_static's default: the QDQ registry plus Add, Mul, Concat, Sigmoid, Softmax, ...
        "all": tuple(sorted(set(QDQRegistry) | set(QLinearOpsRegistry))),
    }


@dataclass(frozen=True)
class QuantConfig:
    """One quantization configuration; the defaults are the reference recipe.

    Attributes:
        approach: One of :data:`APPROACHES`.
        fallback: Names of the quantizable nodes kept in fp32.
        range_estimator: One of :data:`RANGE_ESTIMATORS`.
        per_channel: Per-channel weight scales (else one scale per tensor).
        activation_symmetric: Symmetric int8 activations (else asymmetric uint8).
        weight_symmetric: Symmetric int8 weights (else int8 with a zero point).
        op_types: The operator types that get Q/DQ: one of :data:`OP_TYPE_SET_NAMES`.
        weight_type: One of :data:`WEIGHT_TYPES`.
        recovery: The recovery transforms applied to the fp32 graph first (names of
            :data:`optuna_quant.quantization.recovery.TRANSFORMS`).
    """

    fallback: frozenset[str] = frozenset()
    approach: str = APPROACHES[0]
    range_estimator: str = RANGE_ESTIMATORS[0]
    per_channel: bool = GRANULARITIES[0] == "per_channel"
    activation_symmetric: bool = ACTIVATION_MODES[0] == "symmetric"
    weight_symmetric: bool = WEIGHT_MODES[0] == "symmetric"
    op_types: str = OP_TYPE_SET_NAMES[0]
    weight_type: str = WEIGHT_TYPES[0]
    recovery: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.approach not in APPROACHES:
            raise ValueError(f"Unknown approach {self.approach!r}; choose from {APPROACHES}.")
        if self.range_estimator not in RANGE_ESTIMATORS:
            raise ValueError(
                f"Unknown range_estimator {self.range_estimator!r}; choose from {RANGE_ESTIMATORS}."
            )
        if self.op_types not in OP_TYPE_SET_NAMES:
            raise ValueError(f"Unknown op_types {self.op_types!r}; choose from {OP_TYPE_SET_NAMES}.")
        if self.weight_type not in WEIGHT_TYPES:
            raise ValueError(f"Unknown weight_type {self.weight_type!r}; choose from {WEIGHT_TYPES}.")
        unknown = sorted(self.recovery - set(TRANSFORMS))
        if unknown:
            raise ValueError(f"Unknown recovery transform(s) {unknown}; choose from {sorted(TRANSFORMS)}.")


def quantizable_nodes(model: onnx.ModelProto) -> tuple[str, ...]:
    """Names of the graph's Conv, ConvTranspose, MatMul and Gemm nodes, in graph order."""
    return tuple(n.name for n in model.graph.node if n.op_type in QUANTIZABLE_OP_TYPES)


def _subgraph_nodes(graph: onnx.GraphProto, path: str) -> Iterator[tuple[str, onnx.NodeProto]]:
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                where = f"{path}{node.name or node.op_type}/{attr.name}/"
                for inner in sub.node:
                    yield where, inner
                yield from _subgraph_nodes(sub, where)


def subgraph_quantizable_nodes(model: onnx.ModelProto) -> tuple[str, ...]:
    """Quantizable nodes inside ``If``/``Loop``/``Scan`` bodies, as ``"<parent>/<attr>/<node>"``.

    onnxruntime's calibrators and its QDQ quantizer see the top-level graph only, so these nodes
    stay fp32 whatever the configuration.
    """
    return tuple(
        where + (node.name or node.op_type)
        for where, node in _subgraph_nodes(model.graph, "")
        if node.op_type in QUANTIZABLE_OP_TYPES
    )


def op_type_choices(model: onnx.ModelProto) -> tuple[str, ...]:
    """The :data:`OP_TYPE_SET_NAMES` that make a difference on ``model``, reference first.

    A choice whose operator types present in the graph equal an earlier choice's is dropped:
    it would build the same models.
    """
    present = {n.op_type for n in model.graph.node}
    seen: list[frozenset[str]] = []
    choices = []
    for name, op_types in op_type_sets().items():
        effective = frozenset(op_types) & present
        if effective not in seen:
            seen.append(effective)
            choices.append(name)
    return tuple(choices)


def dynamic_nodes(model: onnx.ModelProto) -> tuple[str, ...]:
    """The quantizable nodes that the dynamic approach quantizes: MatMuls with constant weights.

    A MatMul of two activations (attention's ``Q K^T``) stays fp32 in it, as in onnxruntime's
    ``quantize_dynamic``.
    """
    constants = {init.name for init in model.graph.initializer}
    return tuple(n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in constants)


def approach_choices(model: onnx.ModelProto) -> tuple[str, ...]:
    """The :data:`APPROACHES` that make a difference on ``model``, the reference first.

    ``dynamic`` only where it quantizes something (a MatMul with constant weights, an Attention
    or an LSTM), and first on a model without convolutions (a transformer, an RNN), where
    onnxruntime recommends it and where it beat static Q/DQ in speed and accuracy here
    (docs/models.md); static first on the others, whose convolutions only it quantizes.
    """
    ops = {n.op_type for n in model.graph.node}
    if not dynamic_nodes(model) and not ops & {"Attention", "LSTM"}:
        return APPROACHES[:1]
    if ops & {"Conv", "ConvTranspose"}:
        return APPROACHES
    return tuple(reversed(APPROACHES))


def weight_type_choices(int8_class: str | None) -> tuple[str, ...]:
    """The :data:`WEIGHT_TYPES` worth trying on a CPU of ``int8_class``, the reference first.

    Without VNNI, onnxruntime's x86 u8s8 kernels multiply with ``VPMADDUBSW``, which saturates
    the 16-bit sum of two uint8 x int8 products; 7-bit weights (``reduce_range``) or uint8 weights
    (u8u8 kernels, no saturation) are its documented remedies there. Elsewhere int8 alone.

    Example:
        >>> weight_type_choices("x86-avx2"), weight_type_choices("x86-vnni")
        (('int8', 'int7', 'uint8'), ('int8',))
    """
    return WEIGHT_TYPES if int8_class in SATURATING_INT8_CLASSES else WEIGHT_TYPES[:1]


def effective_config(config: QuantConfig, dynamic: Collection[str]) -> QuantConfig:
    """``config`` as its approach builds it: under ``dynamic``, the fields it ignores (range
    estimator, activation mode, operator types, recovery) at the reference's values and the fallback among
    the nodes it quantizes (``dynamic``, :func:`dynamic_nodes`). Two configurations that build the
    same model are then equal.

    Example:
        >>> effective_config(QuantConfig(approach="dynamic", range_estimator="entropy",
        ...                              fallback=frozenset({"qk", "fc"})), ["fc"])
        QuantConfig(fallback=frozenset({'fc'}), approach='dynamic', range_estimator='minmax', per_channel=True, activation_symmetric=False, weight_symmetric=True, op_types='compute', weight_type='int8', recovery=frozenset())
    """
    if config.approach != "dynamic":
        return config
    reference = QuantConfig()
    return replace(
        config,
        fallback=config.fallback & frozenset(dynamic),
        range_estimator=reference.range_estimator,
        activation_symmetric=reference.activation_symmetric,
        op_types=reference.op_types,
        # The transforms change Conv and Gemm weights, which the dynamic approach leaves fp32.
        recovery=reference.recovery,
    )
