"""Cross-layer equalization: per-channel weight ranges of consecutive layers made equal.

Two layers joined by operators that treat each channel on its own and are positively homogeneous
(``f(x / s) = f(x) / s`` for ``s > 0``: ReLU, LeakyReLU, PReLU, a Clip with no upper bound and a
lower bound of 0, max and average pooling, or none) compute the
same function when the first layer's output channel ``c`` is divided by ``s_c`` and the second
layer's input channel ``c`` multiplied by it (Nagel et al., "Data-Free Quantization Through Weight
Equalization and Bias Correction", 2019). With ``s_c = sqrt(r1_c / r2_c)``, ``r1_c`` the range of
the first layer's weights of channel ``c`` and ``r2_c`` that of the second's, both become
``sqrt(r1_c r2_c)``: a channel whose weights are far wider than the others' no longer sets a
per-tensor scale that rounds the others to a few levels. Depthwise-separable blocks are the case
in point. A chain of layers is equalized pair by pair until the scales settle.

Pairs are Conv -> Conv (any groups: depthwise, pointwise, regular) and Gemm -> Gemm, with
constant weights (and biases) used by that node alone, the first layer's output read by nothing
else. Only initializers change: the graph, its node and tensor names stay as they are, so a
configuration's fallback names the same nodes. An activation range does change (channel ``c``
of the tensors between the pair is divided by ``s_c``), which is why it is a choice of the
search, not a step of the preparation.

Example:
    >>> pairs = equalizable_pairs(model)                                 # doctest: +SKIP
    >>> equalized = equalize(model)                                      # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper


CHANNELWISE_OPS: frozenset[str] = frozenset({"Relu", "LeakyRelu", "PRelu", "Clip", "MaxPool", "AveragePool"})
"""Operators that may sit between an equalized pair: each channel on its own, and positively
homogeneous (a Clip only where it is a ReLU)."""
ITERATIONS = 20
"""Passes over the pairs at most; a chain settles in a few."""
SETTLED = 1e-4
"""A pass whose scales all lie within this of 1 ends the equalization."""


@dataclass(frozen=True)
class Pair:
    """Two layers that :func:`equalize` scales against each other.

    Attributes:
        first: The node whose output channels are divided.
        second: The node whose input channels are multiplied.
        between: The nodes between them (activations, pooling), in graph order.
    """

    first: str
    second: str
    between: tuple[str, ...] = ()


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def _is_relu_clip(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> bool:
    """Whether the Clip ``node`` computes ``max(x, 0)``: a lower bound of 0 and no upper one."""
    low = node.input[1] if len(node.input) > 1 else ""
    high = node.input[2] if len(node.input) > 2 else ""
    if high and not (high in constants and np.all(np.isposinf(numpy_helper.to_array(constants[high])))):
        return False
    return bool(low in constants and np.all(numpy_helper.to_array(constants[low]) == 0))


def _layer(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto], readers: dict[str, list]) -> bool:
    """Whether ``node`` is a Conv or Gemm whose weight and bias are its own constants."""
    if node.op_type not in ("Conv", "Gemm") or (node.op_type == "Gemm" and _attribute(node, "transA", 0)):
        return False
    return all(name in constants and len(readers.get(name, [])) == 1 for name in node.input[1:3] if name)


def equalizable_pairs(model: onnx.ModelProto) -> tuple[Pair, ...]:
    """The pairs of ``model``'s top-level graph that :func:`equalize` scales, in graph order.

    Example:
        >>> from onnx import helper, TensorProto
        >>> w1 = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w1")
        >>> w2 = numpy_helper.from_array(np.ones((2, 4, 1, 1), np.float32), "w2")
        >>> graph = helper.make_graph(
        ...     [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
        ...      helper.make_node("Relu", ["a"], ["r"], name="relu"),
        ...      helper.make_node("Conv", ["r", "w2"], ["y"], name="c2")], "g",
        ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, w2])
        >>> equalizable_pairs(helper.make_model(graph))
        (Pair(first='c1', second='c2', between=('relu',)),)
    """
    graph = model.graph
    constants = {init.name: init for init in graph.initializer}
    readers = _consumers(graph)
    outputs = {value.name for value in graph.output}
    pairs = []
    for node in graph.node:
        if not _layer(node, constants, readers):
            continue
        tensor, between = node.output[0], []
        # Follow the one reader through channel-wise operators; the first other one may be the second layer.
        while tensor not in outputs and len(readers.get(tensor, [])) == 1:
            reader = readers[tensor][0]
            relu_clip = reader.op_type != "Clip" or _is_relu_clip(reader, constants)
            if reader.op_type not in CHANNELWISE_OPS or not relu_clip:
                break
            between.append(reader.name)
            tensor = reader.output[0]
        else:  # a graph output, a branch or a dead end: no pair
            continue
        second = reader
        if second.op_type == node.op_type and second.input[0] == tensor and _layer(second, constants, readers):
            pairs.append(Pair(node.name, second.name, tuple(between)))
    return tuple(pairs)


class _Weights:
    """The arrays of the pairs' layers, read once and written back once."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._constants = {init.name: init for init in model.graph.initializer}
        self._nodes = {node.name: node for node in model.graph.node}
        self._arrays: dict[str, np.ndarray] = {}

    def node(self, name: str) -> onnx.NodeProto:
        return self._nodes[name]

    def array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self._constants[name]).astype(np.float64)
        return self._arrays[name]

    def set(self, name: str, array: np.ndarray) -> None:
        self._arrays[name] = array

    def write_back(self) -> None:
        for name, array in self._arrays.items():
            tensor = self._constants[name]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
            tensor.CopyFrom(numpy_helper.from_array(array.astype(dtype), name))


def _output_axis(node: onnx.NodeProto) -> int:
    """The axis of a layer's weights that runs over its output channels."""
    return 1 if node.op_type == "Gemm" and not _attribute(node, "transB", 0) else 0


def _output_channels(weights: np.ndarray, node: onnx.NodeProto) -> np.ndarray:
    """The output channel that each of a layer's ``weights`` computes, shaped like them."""
    axis = _output_axis(node)
    others = [a for a in range(weights.ndim) if a != axis]
    return np.broadcast_to(np.expand_dims(np.arange(weights.shape[axis]), others), weights.shape)


def _input_channels(weights: np.ndarray, node: onnx.NodeProto) -> np.ndarray:
    """The input channel that each of a layer's ``weights`` multiplies, shaped like them (a
    grouped Conv's ``(out, in / groups, k...)`` weights read their group's channels)."""
    if node.op_type == "Gemm":
        axis = 1 if _attribute(node, "transB", 0) else 0
        return np.broadcast_to(np.expand_dims(np.arange(weights.shape[axis]), 1 - axis), weights.shape)
    out_per_group, in_per_group = weights.shape[0] // _attribute(node, "group", 1), weights.shape[1]
    channel = (np.arange(weights.shape[0]) // out_per_group)[:, None] * in_per_group + np.arange(in_per_group)
    return np.broadcast_to(channel.reshape(channel.shape + (1,) * (weights.ndim - 2)), weights.shape)


def _ranges(weights: np.ndarray, channels: np.ndarray) -> np.ndarray:
    """The largest ``|w|`` of each channel of ``channels``."""
    ranges = np.zeros(int(channels.max()) + 1)
    np.maximum.at(ranges, channels.ravel(), np.abs(weights).ravel())
    return ranges


def _equalize_pair(weights: _Weights, pair: Pair) -> float:
    """Scale ``pair`` in place; the largest ``|log s|`` it applied."""
    first, second = weights.node(pair.first), weights.node(pair.second)
    w1, w2 = weights.array(first.input[1]), weights.array(second.input[1])
    outputs, inputs = _output_channels(w1, first), _input_channels(w2, second)
    r1, r2 = _ranges(w1, outputs), _ranges(w2, inputs)
    if r1.shape != r2.shape:
        return 0.0
    usable = (r1 > 0) & (r2 > 0)
    scale = np.ones_like(r1)
    scale[usable] = np.sqrt(r1[usable] / r2[usable])
    weights.set(first.input[1], w1 / scale[outputs])
    if len(first.input) > 2 and first.input[2]:
        weights.set(first.input[2], weights.array(first.input[2]) / scale)
    weights.set(second.input[1], w2 * scale[inputs])
    return float(np.max(np.abs(np.log(scale))))


def equalize(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with the weights of its :func:`equalizable_pairs` equalized; ``model``
    is not changed.

    A first layer's bias that is not one value per output channel (a broadcast Gemm bias) would
    not scale with its channels: such a pair is left as it is.

    Example:
        >>> equalized = equalize(model)                                  # doctest: +SKIP
    """
    result = onnx.ModelProto()
    result.CopyFrom(model)
    weights = _Weights(result)
    pairs = [pair for pair in equalizable_pairs(result) if _per_channel_bias(weights, pair)]
    for _ in range(ITERATIONS):
        if max((_equalize_pair(weights, pair) for pair in pairs), default=0.0) < SETTLED:
            break
    weights.write_back()
    return result


def _per_channel_bias(weights: _Weights, pair: Pair) -> bool:
    first = weights.node(pair.first)
    if len(first.input) < 3 or not first.input[2]:
        return True
    channels = weights.array(first.input[1]).shape[_output_axis(first)]
    return weights.array(first.input[2]).shape == (channels,)
