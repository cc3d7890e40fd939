"""A small random-weight ONNX CNN, and data to tune it on without a data set.

The calibration data are random images, and the accuracy is the top-1 agreement with the fp32
model's own predictions on other random images (the fp32 model scores exactly 1). The tests and
the worker-scaling benchmark tune this model; it needs neither training nor a download.

Example:
    >>> model = build_cnn(channels=(32, 64, 64), image_size=32)
    >>> study = oq.create_study(model, calibration_data(model), fp32_agreement(model))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper
from onnx import TensorProto
import onnxruntime as ort

from optuna_quant.measure.evaluate import Top1Accuracy


def build_cnn(seed: int = 0, channels: Sequence[int] = (16, 16), image_size: int = 12) -> onnx.ModelProto:
    """A random-weight CNN: a 3x3 Conv-Relu per entry of ``channels``, GlobalAveragePool, Flatten, Gemm.

    Args:
        seed: Seed of the weights.
        channels: Output channels of each convolution.
        image_size: Height and width of the 3-channel input.

    Returns:
        The model, with nodes ``conv1``, ``conv2``, ... and ``fc`` (10 outputs), opset 17.
    """
    rng = np.random.default_rng(seed)

    def init(name: str, *shape: int, scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes, initializers, x = [], [], "input"
    for i, (c_in, c_out) in enumerate(zip((3, *channels), channels), start=1):
        # Activations stay near 1: a larger scale where the fan-in is small (the 3-channel input).
        weight = init(f"w{i}", c_out, c_in, 3, 3, scale=0.3 if i == 1 else 0.1)
        initializers += [weight, init(f"b{i}", c_out, scale=0.1)]
        nodes += [
            helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        x = f"r{i}"
    fc = len(channels) + 1
    initializers += [init(f"w{fc}", 10, channels[-1], scale=0.3), init(f"b{fc}", 10, scale=0.1)]
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", f"w{fc}", f"b{fc}"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, image_size, image_size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _image_shape(model: onnx.ModelProto) -> tuple[int, ...]:
    """The shape of one input image of ``model``, without the batch axis."""
    return tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:])


def calibration_data(model: onnx.ModelProto, n: int = 16, seed: int = 1) -> list[np.ndarray]:
    """``n`` random images in [0, 1), one per batch."""
    rng = np.random.default_rng(seed)
    return [rng.random((1, *_image_shape(model)), dtype=np.float32) for _ in range(n)]


def fp32_agreement(
    model: onnx.ModelProto, n: int = 200, seed: int = 2, session_options: ort.SessionOptions | None = None
) -> Top1Accuracy:
    """Top-1 agreement with ``model``'s fp32 predictions on ``n`` random images: fp32 scores exactly 1.

    Args:
        model: The fp32 model, whose predictions become the labels.
        n: Random images to score on.
        seed: Seed of the images.
        session_options: Options of the session that predicts the labels (onnxruntime's default
            when ``None``).
    """
    inputs = np.random.default_rng(seed).random((n, *_image_shape(model)), dtype=np.float32)
    session = ort.InferenceSession(model.SerializeToString(), session_options, providers=["CPUExecutionProvider"])
    return Top1Accuracy(inputs, session.run(None, {"input": inputs})[0].argmax(axis=1))
