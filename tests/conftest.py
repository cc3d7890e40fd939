"""Fixtures: small real ONNX models built here, real data, fast latency settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper
from onnx import TensorProto
import onnxruntime as ort
import pytest

from optuna_quant.evaluate import Top1Accuracy
from optuna_quant.latency import BenchmarkSettings


def build_cnn(seed: int = 0, channels: int = 16) -> onnx.ModelProto:
    """A small random-weight CNN: Conv-Relu-Conv-Relu-GlobalAveragePool-Flatten-Gemm."""
    rng = np.random.default_rng(seed)
    c = channels

    def init(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 12, 12])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [init("w1", c, 3, 3, 3), init("b1", c, scale=0.1), init("w2", c, c, 3, 3, scale=0.1),
         init("b2", c, scale=0.1), init("w3", 10, c), init("b3", 10, scale=0.1)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="session")
def cnn() -> onnx.ModelProto:
    return build_cnn()


@pytest.fixture(scope="session")
def cnn_path(tmp_path_factory: pytest.TempPathFactory, cnn: onnx.ModelProto) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny_cnn.onnx"
    onnx.save(cnn, str(path))
    return path


@pytest.fixture(scope="session")
def calib() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.random((1, 3, 12, 12), dtype=np.float32) for _ in range(16)]


@pytest.fixture(scope="session")
def agreement(cnn: onnx.ModelProto) -> Top1Accuracy:
    """Top-1 agreement with the fp32 model on 200 inputs: fp32 scores exactly 1."""
    rng = np.random.default_rng(2)
    inputs = rng.random((200, 3, 12, 12), dtype=np.float32)
    session = ort.InferenceSession(cnn.SerializeToString(), providers=["CPUExecutionProvider"])
    labels = session.run(None, {"input": inputs})[0].argmax(axis=1)
    return Top1Accuracy(inputs, labels)


@pytest.fixture(scope="session")
def fast_bench() -> BenchmarkSettings:
    return BenchmarkSettings(warmup=2, blocks=3, min_seconds=0.03)
