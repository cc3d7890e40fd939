"""The ``weight_type`` scope: 7-bit (``reduce_range``) and uint8 weights where the CPU's int8
kernels can saturate, built by onnxruntime's quantizers and run by its sessions."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from optuna_quant.measure.cpu import INT8_CLASSES
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.config import SATURATING_INT8_CLASSES
from optuna_quant.quantization.config import WEIGHT_TYPES
from optuna_quant.quantization.model_io import load_model
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.trial.space import SearchSpace


def _weights(model: onnx.ModelProto, op_types: set[str]) -> list[np.ndarray]:
    """The stored integer weights that nodes of ``op_types`` read, through a DequantizeLinear or directly."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    produced_by = {out: n for n in model.graph.node for out in n.output}
    weights = []
    for node in model.graph.node:
        if node.op_type not in op_types:
            continue
        source = node.input[1]
        if source in produced_by and produced_by[source].op_type == "DequantizeLinear":
            source = produced_by[source].input[0]
        if source in inits and inits[source].dtype.kind in "iu":
            weights.append(inits[source])
    assert weights, f"no integer weights read by {op_types}"
    return weights


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


@pytest.mark.parametrize("int8_class", INT8_CLASSES)
def test_the_scope_has_choices_only_where_the_cpu_can_saturate(cnn, int8_class) -> None:
    space = SearchSpace.from_model(load_model(cnn), int8_class=int8_class)
    if int8_class in SATURATING_INT8_CLASSES:
        assert space.distributions()["weight_type"].choices == WEIGHT_TYPES
        assert space.default_params()["weight_type"] == "int8"  # the reference stays onnxruntime's recipe
        params = {**space.default_params(), "weight_type": "int7"}
        assert space.to_config(params) == QuantConfig(weight_type="int7")
        assert SearchSpace.from_dict(space.to_dict()) == space
    else:
        assert "weight_type" not in space.distributions()
    assert "weight_type" not in SearchSpace.from_model(load_model(cnn), scopes=["layer"], int8_class=int8_class).distributions()


def test_static_int7_weights_use_seven_bits_and_uint8_weights_are_unsigned(cnn, calib) -> None:
    model = load_model(cnn)
    feeds = to_feeds(calib, model)
    quantizer = Quantizer(model, feeds)
    fp32 = _run(model, feeds[0])
    built = {weight_type: quantizer.quantize(QuantConfig(weight_type=weight_type)) for weight_type in WEIGHT_TYPES}
    full, reduced, unsigned = (_weights(built[t], {"Conv", "Gemm"}) for t in WEIGHT_TYPES)
    assert all(w.dtype == np.int8 for w in full + reduced)
    assert max(int(np.abs(w).max()) for w in full) == 127
    assert max(int(np.abs(w).max()) for w in reduced) == 64  # 7 bits, symmetric: [-64, 64]
    assert all(w.dtype == np.uint8 for w in unsigned)
    for weight_type, int8 in built.items():
        onnx.checker.check_model(int8)
        output = _run(int8, feeds[0])
        assert np.argmax(output, axis=1).tolist() == np.argmax(fp32, axis=1).tolist(), weight_type


def test_dynamic_int7_weights_use_seven_bits_and_uint8_weights_are_unsigned(bert_path, bert_feeds) -> None:
    prepared = prepare_model(bert_path, bert_feeds).prepared
    quantizer = Quantizer(prepared, bert_feeds)
    fp32 = _run(prepared, bert_feeds[0])
    for weight_type, dtype, bound in (("int7", np.int8, 65), ("uint8", np.uint8, 256)):
        int8 = quantizer.quantize(QuantConfig(approach="dynamic", weight_type=weight_type))
        weights = _weights(int8, {"MatMulInteger"})
        assert all(w.dtype == dtype for w in weights), weight_type
        assert all(np.abs(w.astype(np.int32)).max() < bound for w in weights), weight_type
        output = _run(int8, bert_feeds[0])
        cosine = np.sum(output * fp32) / (np.linalg.norm(output) * np.linalg.norm(fp32))
        assert cosine > 0.99, weight_type
