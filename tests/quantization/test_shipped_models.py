"""Models as PyPI wheels ship them, unmodified: load, prepare, search space, calibrate, quantize.

The wheels are installed without their dependencies (see :mod:`optuna_quant.testing.shipped`);
a test skips, naming the package, only when its wheel is not installed.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.model_io import opset_of
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.testing.shipped import SHIPPED
from optuna_quant.testing.shipped import ShippedModel
from optuna_quant.testing.shipped import text_line
from optuna_quant.trial.space import SearchSpace


# name: (opset as shipped, quantizable layers once prepared)
EXPECTED = {
    "ddddocr_rec": (12, 22),
    "rapidocr_rec": (12, 51),
    "rapidocr_cls": (11, 54),
    "silero_vad_sequence": (16, 6),
    "silero_vad_op15": (15, 6),
}


def _installed(name: str) -> ShippedModel:
    model = SHIPPED[name]
    if model.path() is None:
        pytest.skip(f"{model.package} is not installed (pip install --no-deps {model.package})")
    return model


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_model_prepares_and_quantizes_in_every_op_types_choice(name: str) -> None:
    shipped = _installed(name)
    feeds = shipped.feeds(6)
    prepared = prepare_model(shipped.path(), feeds)
    opset, layers = EXPECTED[name]
    assert opset_of(prepared.original) == opset
    assert opset_of(prepared.prepared) >= 13
    assert any(step.startswith("quant_pre_process") and "skipped" not in step for step in prepared.steps)
    assert len(prepared.prepared.graph.node) < len(prepared.original.graph.node)
    space = SearchSpace.from_model(prepared.prepared)
    assert len(space.nodes) == layers
    quantizer = Quantizer(prepared.prepared, feeds)
    fp32 = _session(prepared.original)
    want = fp32.run(None, feeds[0])
    for op_types in space.op_types:
        int8 = quantizer.quantize(QuantConfig(op_types=op_types, fallback=frozenset(space.nodes[-1:])))
        produced_by = {out: n.op_type for n in int8.graph.node for out in n.output}
        weights = {n.name: produced_by.get(n.input[1]) for n in int8.graph.node if n.name in space.nodes}
        assert weights[space.nodes[0]] == "DequantizeLinear", op_types
        assert weights[space.nodes[-1]] != "DequantizeLinear", op_types  # the fallback stays fp32
        got = _session(int8).run(None, feeds[0])
        assert [a.shape for a in got] == [a.shape for a in want]
        assert all(np.isfinite(a).all() for a in got)


def test_rapidocr_minus_one_batch_and_batch_norm_folding() -> None:
    shipped = _installed("rapidocr_cls")
    batch = {"x": np.concatenate([shipped.feed(i)["x"] for i in range(3)])}  # a batch of 3 for a -1
    prepared = prepare_model(shipped.path(), [batch])
    assert prepared.steps[0].startswith("dynamic dims: x[0]")
    ops = [n.op_type for n in prepared.prepared.graph.node]
    assert "BatchNormalization" not in ops  # folded into the convolutions
    assert [n.op_type for n in prepared.original.graph.node].count("BatchNormalization") == 35
    assert _session(prepared.prepared).run(None, batch)[0].shape == (3, 2)


def test_silero_if_bodies_are_named_not_searched(caplog) -> None:
    shipped = _installed("silero_vad")
    caplog.set_level(logging.WARNING, logger="optuna_quant")
    prepared = prepare_model(shipped.path(), shipped.feeds(2))
    warning = next(r.getMessage() for r in caplog.records if "If/Loop/Scan" in r.getMessage())
    assert warning.startswith("12 quantizable nodes sit inside If/Loop/Scan bodies and stay fp32")
    assert "If_0/then_branch/" in warning and "encoder/0/reparam_conv/Conv" in warning
    with pytest.raises(ValueError, match="no quantizable node .* in its top-level graph; 12 sit inside If/Loop/Scan"):
        SearchSpace.from_model(prepared.prepared)


@pytest.mark.parametrize("estimator", ["minmax", "percentile_99.99"])
def test_calibration_of_variable_width_text_lines(estimator: str) -> None:
    # One feed per collect_data call also lets lines of different widths calibrate together
    # (onnxruntime stacks the samples of one call into one array).
    shipped = _installed("ddddocr_rec")
    feeds = [{"input1": text_line("ab12", 64, width, 1)} for width in (96, 160, 224)]
    prepared = prepare_model(shipped.path(), feeds)
    int8 = Quantizer(prepared.prepared, feeds).quantize(QuantConfig(range_estimator=estimator))
    want = _session(prepared.original).run(None, feeds[2])[0]
    assert _session(int8).run(None, feeds[2])[0].shape == want.shape


def test_the_example_of_docs_models_md_runs_as_written(capsys) -> None:
    _installed("rapidocr_cls")
    text = (Path(__file__).parents[2] / "docs" / "models.md").read_text()
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(example, "docs/models.md", "exec"), namespace)
    printed = capsys.readouterr().out.strip()
    # The comment under print() shows the steps, wrapped over two lines.
    shown = " ".join(line[1:].strip() for line in example.splitlines() if line.startswith(("# (", "#  '")))
    assert printed == str(namespace["prepared"].steps) == shown
    assert len(namespace["space"].nodes) == 54


def test_prepared_node_names_are_stable_and_all_named() -> None:
    shipped = _installed("rapidocr_cls")  # its Relu, HardSigmoid, ... nodes ship unnamed
    feeds = shipped.feeds(2)
    first, second = (prepare_model(shipped.path(), feeds).prepared for _ in range(2))
    names = [n.name for n in first.graph.node]
    assert names == [n.name for n in second.graph.node]
    assert all(names) and len(set(names)) == len(names)


# ddddocr's last Gemm becomes a MatMul once prepared; silero-vad has none with constant weights.
MATMULS_BESIDE_THE_LSTM = {"ddddocr_rec": 1, "silero_vad_sequence": 0}


@pytest.mark.parametrize("name", sorted(MATMULS_BESIDE_THE_LSTM))
def test_every_dynamic_configuration_of_an_lstm_runs(name: str) -> None:
    # DynamicQuantizeLSTM refuses asymmetric weights when it runs, not when the model is built:
    # before the override, every dynamic trial with asymmetric weights failed on ddddocr.
    shipped = _installed(name)
    feeds = shipped.feeds(2)
    prepared = prepare_model(shipped.path(), feeds)
    quantizer = Quantizer(prepared.prepared, feeds)
    want = _session(prepared.original).run(None, feeds[0])
    for per_channel in (True, False):
        for weight_symmetric in (True, False):
            config = QuantConfig(approach="dynamic", per_channel=per_channel, weight_symmetric=weight_symmetric)
            int8 = quantizer.quantize(config)
            assert "DynamicQuantizeLSTM" in {n.op_type for n in int8.graph.node}, config
            got = _session(int8).run(None, feeds[0])
            assert [a.shape for a in got] == [a.shape for a in want], config
            assert all(np.isfinite(a).all() for a in got), config
            # The MatMuls keep the weight mode asked for: their zero point is 0 only when symmetric.
            initializers = {init.name: init for init in int8.graph.initializer}
            matmul_zero_points = [
                onnx.numpy_helper.to_array(initializers[n.input[3]])
                for n in int8.graph.node
                if n.op_type == "MatMulInteger"
            ]
            assert len(matmul_zero_points) == MATMULS_BESIDE_THE_LSTM[name], config
            assert all((zp == 0).all() == weight_symmetric for zp in matmul_zero_points), config
