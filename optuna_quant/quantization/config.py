"""What one int8 configuration is, and which nodes of a graph can take one: no Optuna here.

:class:`QuantConfig` is what :mod:`optuna_quant.quantization.quantize` builds a model from; its
defaults are the reference recipe, onnxruntime's recommended one (asymmetric uint8 activations,
symmetric int8 weights, per channel, Q/DQ around the compute-heavy operators only). The Optuna
search space over it is :class:`optuna_quant.trial.space.SearchSpace`.

Example:
    >>> config = QuantConfig(fallback=frozenset({"fc"}), per_channel=False)
    >>> config.range_estimator, config.op_types
    ('minmax', 'compute')
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
import functools

import onnx

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
GRANULARITIES: tuple[str, ...] = ("per_channel", "per_tensor")
ACTIVATION_MODES: tuple[str, ...] = ("asymmetric", "symmetric")
WEIGHT_MODES: tuple[str, ...] = ("symmetric", "asymmetric")


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
        fallback: Names of the quantizable nodes kept in fp32.
        range_estimator: One of :data:`RANGE_ESTIMATORS`.
        per_channel: Per-channel weight scales (else one scale per tensor).
        activation_symmetric: Symmetric int8 activations (else asymmetric uint8).
        weight_symmetric: Symmetric int8 weights (else int8 with a zero point).
        op_types: The operator types that get Q/DQ: one of :data:`OP_TYPE_SET_NAMES`.
    """

    fallback: frozenset[str] = frozenset()
    range_estimator: str = RANGE_ESTIMATORS[0]
    per_channel: bool = GRANULARITIES[0] == "per_channel"
    activation_symmetric: bool = ACTIVATION_MODES[0] == "symmetric"
    weight_symmetric: bool = WEIGHT_MODES[0] == "symmetric"
    op_types: str = OP_TYPE_SET_NAMES[0]

    def __post_init__(self) -> None:
        if self.range_estimator not in RANGE_ESTIMATORS:
            raise ValueError(
                f"Unknown range_estimator {self.range_estimator!r}; choose from {RANGE_ESTIMATORS}."
            )
        if self.op_types not in OP_TYPE_SET_NAMES:
            raise ValueError(f"Unknown op_types {self.op_types!r}; choose from {OP_TYPE_SET_NAMES}.")


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
