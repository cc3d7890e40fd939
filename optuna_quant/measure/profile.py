"""Node time by onnxruntime's profiler: per layer of the model (charged back to it), or per operator type.

onnxruntime fuses ``DequantizeLinear -> Conv -> QuantizeLinear`` into ``QLinearConv`` (named
``<layer>_token_<n>``) and fp32 ``Conv -> Relu`` into an NCHWc ``Conv`` named after the Relu's
output, so a node of the optimized graph is charged to a layer by its name or by a weight of the
layer among its inputs (:func:`layer_of`); a node with a single data input that maps to none is
charged to its input's producer's layer. What stays unattributed is reported apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
import json
from pathlib import Path
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.quantization.model_io import Feed


PROFILE_SUFFIX = "_kernel_time"


def layer_of(node: onnx.NodeProto, layers: Mapping[str, Iterable[str]]) -> str | None:
    """The layer that a node of onnxruntime's optimized graph computes, or ``None``.

    Names are tried longest first, so that a layer whose name extends another's
    (``node_conv2d_1`` and ``node_conv2d``) gets its own nodes.

    Args:
        node: A node of the optimized graph.
        layers: For each layer (every quantizable node of the model, so that none is charged
            to another), the names of its initializers (weight, bias).

    Example:
        >>> from onnx import helper
        >>> layers = {"conv": ["w"], "conv_1": ["w_1"], "/2/Conv": ["2.weight"]}
        >>> fused = helper.make_node("QLinearConv", ["x", "s", "z", "w_1_quantized"], ["y"], name="conv_1_token_5")
        >>> layer_of(fused, layers)
        'conv_1'
        >>> layer_of(helper.make_node("Conv", ["x", "w_1_reorder"], ["y"], name="/1/Relu_output_0_nchwc"), layers)
        'conv_1'
        >>> layer_of(helper.make_node("Relu", ["x"], ["y"], name="/1/Relu"), layers) is None
        True
    """
    for layer in sorted(layers, key=len, reverse=True):
        if node.name == layer or node.name.startswith(layer + "_"):
            return layer
    matches = [
        (len(init), layer)
        for layer, initializers in layers.items()
        for init in initializers
        for name in node.input
        if name == init or name.startswith(init + "_")
    ]
    return max(matches)[1] if matches else None


def initializers_of(model: onnx.ModelProto, nodes: Iterable[str]) -> dict[str, list[str]]:
    """The initializers (weight, bias) among the inputs of each of ``nodes``, by node name."""
    initializers = {init.name for init in model.graph.initializer}
    by_name = {n.name: n for n in model.graph.node}
    return {name: [i for i in by_name[name].input if i in initializers] for name in nodes}


def _owners(graph: onnx.GraphProto, layers: Mapping[str, Iterable[str]]) -> dict[str, str | None]:
    """The layer of each node of an optimized graph (in topological order): its own by
    :func:`layer_of`, else, for a node with a single data input, that input's producer's."""
    constants = {init.name for init in graph.initializer}
    producer: dict[str, str] = {}
    owner: dict[str, str | None] = {}
    for node in graph.node:
        layer = layer_of(node, layers)
        data = [name for name in node.input if name and name not in constants]
        if layer is None and len(data) == 1 and data[0] in producer:
            # What onnxruntime leaves between fused kernels (the int8 model's Relu and its
            # QuantizeLinear, a layout reorder) continues the layer whose output it carries on,
            # as the Relu fused into the fp32 Conv is part of that layer.
            layer = owner[producer[data[0]]]
        owner[node.name] = layer
        producer.update(dict.fromkeys(node.output, node.name))
    return owner


@dataclass(frozen=True)
class _Profile:
    """The median time of each node of onnxruntime's optimized graph over the kept runs, in ms."""

    node_ms: dict[str, float]
    op_type: dict[str, str]
    optimized: onnx.ModelProto


def _profile(model: onnx.ModelProto, feed: Feed, settings: BenchmarkSettings, runs: int) -> _Profile:
    with tempfile.TemporaryDirectory(prefix="optuna-quant-profile-") as folder:
        options = settings.session_options()
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for _ in range(2 * runs):  # the first half warms up; only the second half is kept
            session.run(None, feed)
        trace = json.loads(Path(session.end_profiling()).read_text())
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    durations: dict[str, list[float]] = {}
    op_type: dict[str, str] = {}
    for event in trace:
        if event.get("cat") == "Node" and event["name"].endswith(PROFILE_SUFFIX):
            name = event["name"].removesuffix(PROFILE_SUFFIX)
            durations.setdefault(name, []).append(event["dur"])
            op_type[name] = event.get("args", {}).get("op_name", "?")
    node_ms = {name: float(np.median(micros[len(micros) // 2 :])) / 1000 for name, micros in durations.items()}
    return _Profile(node_ms, op_type, optimized)


def profile_layers(
    model: onnx.ModelProto,
    feed: Feed,
    layers: Mapping[str, Iterable[str]],
    settings: BenchmarkSettings,
    runs: int,
) -> tuple[dict[str, float], float]:
    """Per-layer node time of ``model`` on ``feed`` by onnxruntime's profiler, per run, in ms.

    Args:
        model: The model to profile.
        feed: One input dict.
        layers: For each layer, its initializers' names (see :func:`layer_of`).
        settings: The threads to run on.
        runs: Profiled runs, after as many untimed ones; each node's median counts.

    Returns:
        The time of each layer (0 for a layer without a node), and the unattributed node time.
    """
    profile = _profile(model, feed, settings, runs)
    owner = _owners(profile.optimized.graph, layers)
    per_layer = dict.fromkeys(layers, 0.0)
    unattributed = 0.0
    for name, ms in profile.node_ms.items():
        layer = owner.get(name)
        if layer is None:
            unattributed += ms
        else:
            per_layer[layer] += ms
    return per_layer, unattributed


def profile_op_types(model: onnx.ModelProto, feed: Feed, settings: BenchmarkSettings, runs: int) -> dict[str, float]:
    """Node time per operator type of the graph onnxruntime runs (fused kernels under their own
    type), per run, in ms, the slowest type first.

    Example:
        >>> from onnx import helper, TensorProto
        >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
        >>> graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g", [x],
        ...                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
        >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        >>> list(profile_op_types(model, {"x": np.ones((1, 8), np.float32)}, BenchmarkSettings(), runs=2))
        ['Softmax']
    """
    profile = _profile(model, feed, settings, runs)
    per_type: dict[str, float] = {}
    for name, ms in profile.node_ms.items():
        op = profile.op_type[name]
        per_type[op] = per_type.get(op, 0.0) + ms
    return dict(sorted(per_type.items(), key=lambda item: -item[1]))
