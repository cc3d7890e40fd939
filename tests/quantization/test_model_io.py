"""Bad input is named in the error, before any trial runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from onnx import TensorProto
import onnxruntime as ort
import pytest

import optuna_quant as oq
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.model_io import load_model
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.trial.space import SearchSpace


def test_missing_model_file(calib, agreement) -> None:
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        oq.create_study("nope.onnx", calib, agreement, storage="sqlite:///:memory:")


def test_unreadable_model_file(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"\x00not a protobuf at all" * 10)
    with pytest.raises(ValueError, match="garbage.onnx"):
        load_model(bad)


def test_model_failing_the_checker(tmp_path: Path, cnn: onnx.ModelProto) -> None:
    broken = onnx.ModelProto()
    broken.CopyFrom(cnn)
    broken.graph.node[1].input[0] = "no_such_tensor"
    path = tmp_path / "broken.onnx"
    onnx.save(broken, str(path))
    with pytest.raises(ValueError, match="broken.onnx.*checker"):
        load_model(path)


def test_model_without_quantizable_node() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "relu_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match="no quantizable node"):
        SearchSpace.from_model(load_model(model))


def _with_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    old = onnx.ModelProto()
    old.CopyFrom(model)
    old.opset_import[0].version = opset
    return old


def test_old_opset_is_lifted_with_the_same_outputs(cnn: onnx.ModelProto, calib) -> None:
    old = _with_opset(cnn, 11)  # Conv, Relu, GlobalAveragePool, Flatten, Gemm: valid in opset 11
    prepared = prepare_model(old, to_feeds(calib[:4], old), pre_process=False)
    assert prepared.steps == ("opset 11 -> 13",)
    assert prepared.original.opset_import[0].version == 11
    assert prepared.prepared.opset_import[0].version == 13
    # The lifted model quantizes per channel.
    int8 = Quantizer(prepared.prepared, to_feeds(calib, old)).quantize(QuantConfig())
    session = ort.InferenceSession(int8.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": calib[0]})[0].shape == (1, 10)


def test_minus_one_dims_are_dynamic(cnn: onnx.ModelProto, calib) -> None:
    shipped_style = onnx.ModelProto()
    shipped_style.CopyFrom(cnn)
    for value in (shipped_style.graph.input[0], shipped_style.graph.output[0]):
        value.type.tensor_type.shape.dim[0].Clear()
        value.type.tensor_type.shape.dim[0].dim_value = -1
    batch = np.concatenate(calib[:3])
    feeds = to_feeds([batch], shipped_style)  # a batch of 3 where the file says -1
    prepared = prepare_model(shipped_style, feeds)
    assert prepared.steps[0] == "dynamic dims: input[0], logits[0]"
    assert prepared.prepared.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "input_dim0"
    int8 = Quantizer(prepared.prepared, feeds).quantize(QuantConfig())
    session = ort.InferenceSession(int8.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": batch})[0].shape == (3, 10)


def test_external_data_is_loaded_and_quantized(tmp_path: Path, cnn: onnx.ModelProto, calib) -> None:
    path = tmp_path / "external.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(cnn)  # saving as external data rewrites the proto it is given
    onnx.save(copy, str(path), save_as_external_data=True, location="external.onnx.data", size_threshold=0)
    assert path.stat().st_size < cnn.ByteSize() / 2  # the weights live in the data file
    prepared = prepare_model(path, to_feeds(calib[:4], cnn))
    int8 = Quantizer(prepared.prepared, to_feeds(calib, cnn)).quantize(QuantConfig())
    fp32 = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session = ort.InferenceSession(int8.SerializeToString(), providers=["CPUExecutionProvider"])
    want, got = fp32.run(None, {"input": calib[0]})[0], session.run(None, {"input": calib[0]})[0]
    assert np.argmax(want) == np.argmax(got)
    # A ModelProto read without its data is refused with the way out.
    with pytest.raises(ValueError, match="external data files that were not loaded: pass the model's path"):
        load_model(onnx.load(str(path), load_external_data=False))


def test_integer_data_for_a_float_input_is_refused(cnn: onnx.ModelProto) -> None:
    images = np.full((1, 3, 12, 12), 200, np.uint8)
    images[0, 0, 0, 0] = 3
    with pytest.raises(ValueError, match=r"calibration_data\[0\]: input 'input' is float32 but the data is uint8 \(values 3 to 200\).*/ 255"):
        to_feeds([images], cnn)
    assert to_feeds([images.astype(np.float64) / 255], cnn)[0]["input"].dtype == np.float32


def test_fractional_data_for_an_integer_input_is_refused() -> None:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["y"], to=TensorProto.FLOAT)],
        "ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
    )
    model = helper.make_model(graph)
    assert to_feeds([np.array([[1.0, 2.0, 3.0]])], model)[0]["ids"].dtype == np.int64
    with pytest.raises(ValueError, match="'ids' is int64 but the data is float64 with fractional values"):
        to_feeds([np.array([[1.5, 2.0, 3.0]])], model)


def test_calibration_names_and_shapes(cnn: onnx.ModelProto) -> None:
    with pytest.raises(ValueError, match=r"calibration_data\[0\].*\['image'\].*\['input'\]"):
        to_feeds([{"image": np.zeros((1, 3, 12, 12), np.float32)}], cnn)
    with pytest.raises(ValueError, match=r"calibration_data\[1\].*'input'.*\(1, 3, 8, 8\)"):
        to_feeds([np.zeros((1, 3, 12, 12), np.float32), np.zeros((1, 3, 8, 8), np.float32)], cnn)
    with pytest.raises(ValueError, match="empty"):
        to_feeds([], cnn)


def test_unknown_node_and_scope(cnn: onnx.ModelProto) -> None:
    with pytest.raises(ValueError, match="conv9"):
        SearchSpace.from_model(load_model(cnn), nodes=["conv1", "conv9"])
    with pytest.raises(ValueError, match="precision"):
        SearchSpace.from_model(load_model(cnn), scopes=["layer", "precision"])


def test_unknown_sampler_and_load_method(cnn_path, calib, agreement) -> None:
    with pytest.raises(ValueError, match="annealing"):
        oq.create_study(cnn_path, calib, agreement, sampler="annealing", storage="sqlite:///:memory:")
    with pytest.raises(ValueError, match="hot_start"):
        oq.create_study(cnn_path, calib, agreement, trials_load_method="hot_start", storage="sqlite:///:memory:")


@pytest.mark.parametrize("accuracy_loss, latency_reduce", [(-1, 1.5), (1.0, -2.0), (500, 1.0), (1.0, 1e9)])
def test_absurd_targets(cnn_path, calib, agreement, accuracy_loss, latency_reduce) -> None:
    with pytest.raises(ValueError, match="accuracy_loss|latency_reduce"):
        oq.create_study(
            cnn_path, calib, agreement, accuracy_loss=accuracy_loss, latency_reduce=latency_reduce,
            storage="sqlite:///:memory:",
        )


def test_eval_fn_raising_on_fp32_fails_before_any_trial(tmp_path, cnn_path, calib) -> None:
    def broken(session):
        raise KeyError("labels")

    study = oq.create_study(cnn_path, calib, broken, storage=f"sqlite:///{tmp_path}/s.db", sampler="random")
    with pytest.raises(RuntimeError, match="eval_fn raised on the fp32 model.*labels"):
        study.optimize(n_trials=3)
    assert study.trials == []


@pytest.mark.parametrize("value", [float("nan"), "0.9", None, float("inf")])
def test_eval_fn_returning_non_number(tmp_path, cnn_path, calib, value) -> None:
    study = oq.create_study(
        cnn_path, calib, lambda session: value, storage=f"sqlite:///{tmp_path}/s.db", sampler="random"
    )
    with pytest.raises(ValueError, match="eval_fn on the fp32 model returned"):
        study.optimize(n_trials=2)


def test_eval_subset_size_needs_a_keyword(cnn_path, calib) -> None:
    with pytest.raises(ValueError, match="subset_size"):
        oq.create_study(cnn_path, calib, lambda s: 1.0, eval_subset_size=10, storage="sqlite:///:memory:")


def test_bad_benchmark_key(cnn_path, calib, agreement) -> None:
    with pytest.raises(ValueError, match="repeats"):
        oq.create_study(cnn_path, calib, agreement, benchmark={"repeats": 3}, storage="sqlite:///:memory:")


def test_a_model_that_does_not_run_on_the_data_is_named(cnn: onnx.ModelProto) -> None:
    # The checker passes a Conv whose weight has the wrong input channels; onnxruntime does not.
    broken = onnx.ModelProto()
    broken.CopyFrom(cnn)
    weight = next(init for init in broken.graph.initializer if init.name == "w2")
    weight.CopyFrom(onnx.numpy_helper.from_array(np.zeros((16, 5, 3, 3), np.float32), "w2"))
    with pytest.raises(ValueError, match="does not run in onnxruntime on the calibration data"):
        prepare_model(broken, [{"input": np.zeros((1, 3, 12, 12), np.float32)}])
    with pytest.raises(ValueError, match="does not run in onnxruntime on the calibration data"):
        oq.create_study(broken, [np.zeros((1, 3, 12, 12), np.float32)], lambda session: 1.0, storage="sqlite:///:memory:")


def test_a_model_that_onnxruntime_cannot_load_is_named_before_anything_runs() -> None:
    # The checker lets an operator of an unknown domain pass; onnxruntime refuses to load it.
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Foo", ["x"], ["y"], domain="custom.ops")], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("custom.ops", 1)])
    with pytest.raises(ValueError, match="onnxruntime cannot load the model: .*custom.ops:Foo"):
        oq.create_study(model, [np.zeros((1, 4), np.float32)], lambda session: 1.0, storage="sqlite:///:memory:")
