from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto
import onnxruntime as ort
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization.calibrate import create_calibrator
from onnxruntime.quantization.calibrate import HistogramCollector
import optuna
import pytest

from optuna_quant.quantization.config import op_type_choices
from optuna_quant.quantization.config import OP_TYPE_SET_NAMES
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.config import RANGE_ESTIMATORS
from optuna_quant.quantization.entropy import entropy_threshold
from optuna_quant.quantization.entropy import FastEntropyCollector
from optuna_quant.quantization.model_io import batch_of
from optuna_quant.quantization.model_io import load_model
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import collect
from optuna_quant.quantization.quantize import ENTROPY_NUM_BINS
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.quantization.quantize import seed_histograms
from optuna_quant.trial.space import SearchSpace


@pytest.fixture(scope="module")
def quantizer(cnn, calib) -> Quantizer:
    model = load_model(cnn)
    return Quantizer(model, to_feeds(calib, model))


def test_space_from_graph(cnn) -> None:
    space = SearchSpace.from_model(load_model(cnn))
    assert space.nodes == ("conv1", "conv2", "fc")
    assert space.op_types == ("compute", "qdq", "all")
    assert set(space.distributions()) == {
        "layer:conv1", "layer:conv2", "layer:fc", "range_estimator", "granularity",
        "activation_mode", "weight_mode", "op_types", "equalization",
    }
    # The reference is onnxruntime's recommended recipe, Q/DQ around the compute-heavy nodes only.
    assert space.default_params() == {
        "layer:conv1": "int8", "layer:conv2": "int8", "layer:fc": "int8",
        "range_estimator": "minmax", "granularity": "per_channel",
        "activation_mode": "asymmetric", "weight_mode": "symmetric", "op_types": "compute", "equalization": "off",
    }
    reference = space.to_config(space.default_params())
    assert reference == QuantConfig()
    assert (reference.per_channel, reference.activation_symmetric, reference.weight_symmetric) == (True, False, True)


def test_op_type_choices_that_build_the_same_model_are_dropped(cnn) -> None:
    # The tiny CNN has Conv, Relu, GlobalAveragePool, Flatten, Gemm: three distinct choices.
    assert op_type_choices(cnn) == ("compute", "qdq", "all")
    # Without GlobalAveragePool (in "all" only), "all" quantizes what "qdq" does.
    no_gap = onnx.ModelProto()
    no_gap.CopyFrom(cnn)
    gap = next(n for n in no_gap.graph.node if n.op_type == "GlobalAveragePool")
    gap.op_type = "MaxPool"  # only the op type set matters here
    assert op_type_choices(no_gap) == ("compute", "qdq")


def test_scopes_switch_off_and_restrict_nodes(cnn) -> None:
    space = SearchSpace.from_model(load_model(cnn), scopes=["layer", "mode"], nodes=["conv2"])
    assert set(space.distributions()) == {"layer:conv2", "activation_mode", "weight_mode"}
    config = space.to_config({"layer:conv2": "fp32", "activation_mode": "symmetric", "weight_mode": "asymmetric"})
    assert config == QuantConfig(fallback=frozenset({"conv2"}), activation_symmetric=True, weight_symmetric=False)


def test_narrow_keeps_best_as_base(cnn) -> None:
    space = SearchSpace.from_model(load_model(cnn))
    best = QuantConfig(
        fallback=frozenset({"fc"}), range_estimator="percentile_99.99", per_channel=False,
        activation_symmetric=True, op_types="qdq",
    )
    narrowed = space.narrow(best, ["range_estimator"])
    assert set(narrowed.distributions()) == {"range_estimator"}
    assert narrowed.to_config({"range_estimator": "entropy"}) == QuantConfig(
        fallback=frozenset({"fc"}), range_estimator="entropy", per_channel=False,
        activation_symmetric=True, op_types="qdq",
    )
    assert SearchSpace.from_dict(narrowed.to_dict()) == narrowed
    only_ops = space.narrow(best, ["op_types"])
    assert only_ops.to_config({"op_types": "all"}) == QuantConfig(
        fallback=frozenset({"fc"}), range_estimator="percentile_99.99", per_channel=False,
        activation_symmetric=True, op_types="all",
    )
    assert SearchSpace.from_dict(only_ops.to_dict()) == only_ops


def test_to_config_rejects_foreign_values(cnn) -> None:
    space = SearchSpace.from_model(load_model(cnn), scopes=["mode", "op_types"])
    with pytest.raises(ValueError, match="'activation_mode'.*'loose'"):
        space.to_config({"activation_mode": "loose", "weight_mode": "symmetric", "op_types": "all"})
    with pytest.raises(ValueError, match="'op_types'.*'every'"):
        space.to_config({"activation_mode": "symmetric", "weight_mode": "symmetric", "op_types": "every"})
    with pytest.raises(ValueError, match="op_types 'every'"):
        QuantConfig(op_types="every")


def test_suggest_on_a_real_trial(cnn) -> None:
    space = SearchSpace.from_model(load_model(cnn))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    params = space.suggest(trial)
    assert params == trial.params
    assert trial.distributions == space.distributions()
    assert space.to_config(params) == QuantConfig(
        fallback=frozenset(k.removeprefix("layer:") for k, v in params.items() if v == "fp32"),
        range_estimator=params["range_estimator"],
        per_channel=params["granularity"] == "per_channel",
        activation_symmetric=params["activation_mode"] == "symmetric",
        weight_symmetric=params["weight_mode"] == "symmetric",
        op_types=params["op_types"],
    )


def _zero_point_types(model: onnx.ModelProto) -> dict[str, int]:
    """The element type of each QuantizeLinear's zero point, by the tensor it quantizes."""
    inits = {init.name: init for init in model.graph.initializer}
    return {
        node.input[0]: inits[node.input[2]].data_type for node in model.graph.node if node.op_type == "QuantizeLinear"
    }


def _weight_zero_points(model: onnx.ModelProto, node_name: str) -> np.ndarray:
    produced_by = {out: n for n in model.graph.node for out in n.output}
    node = next(n for n in model.graph.node if n.name == node_name)
    dequantize = produced_by[node.input[1]]
    inits = {init.name: init for init in model.graph.initializer}
    return onnx.numpy_helper.to_array(inits[dequantize.input[2]])


def test_activation_and_weight_types_follow_their_modes(quantizer) -> None:
    reference = quantizer.quantize(QuantConfig())
    assert set(_zero_point_types(reference).values()) == {TensorProto.UINT8}
    zero = _weight_zero_points(reference, "conv2")
    assert zero.dtype == np.int8 and not zero.any()  # symmetric int8 weights, per channel
    assert zero.shape == (16,)
    symmetric = quantizer.quantize(QuantConfig(activation_symmetric=True, weight_symmetric=False, per_channel=False))
    types = _zero_point_types(symmetric)
    assert set(types.values()) == {TensorProto.INT8}  # signed activations when symmetric
    inits = {i.name: i for i in symmetric.graph.initializer}
    activation_zero = next(
        inits[n.input[2]] for n in symmetric.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "r1"
    )
    assert onnx.numpy_helper.to_array(activation_zero) == 0
    weights = _weight_zero_points(symmetric, "conv2")
    assert weights.dtype == np.int8 and weights.shape == ()  # int8 weights with a zero point


def test_op_types_decide_which_tensors_get_qdq(quantizer) -> None:
    models = {name: quantizer.quantize(QuantConfig(op_types=name)) for name in OP_TYPE_SET_NAMES}
    quantized = {name: set(_zero_point_types(model)) for name, model in models.items()}
    # compute: the Relus fold into their Conv's output range (r1, r2 quantized, c1, c2 not)...
    assert quantized["compute"] == {"input", "r1", "r2", "flat", "logits_QuantizeLinear_Input"}
    assert not [n for n in models["compute"].graph.node if n.op_type == "Relu"]
    # ... and the GlobalAveragePool (no int8 kernel in the QDQ registry) stays fp32 but in "all".
    assert quantized["qdq"] == quantized["compute"]
    assert quantized["all"] == quantized["compute"] | {"gap"}


def test_int8_models_pass_the_onnx_checker(quantizer) -> None:
    # What tune, best and export write: tools that validate ONNX refuse an unsorted graph.
    for config in (QuantConfig(), QuantConfig(op_types="all", fallback=frozenset({"conv2"}))):
        onnx.checker.check_model(quantizer.quantize(config), full_check=True)


def test_fallback_node_stays_fp32(quantizer, calib) -> None:
    int8 = quantizer.quantize(QuantConfig(fallback=frozenset({"fc"})))
    # fc keeps a float weight: no DequantizeLinear feeds its weight input.
    produced_by = {out: n for n in int8.graph.node for out in n.output}
    fc = next(n for n in int8.graph.node if n.name == "fc")
    assert fc.input[1] not in produced_by
    conv2 = next(n for n in int8.graph.node if n.name == "conv2")
    assert produced_by[conv2.input[1]].op_type == "DequantizeLinear"
    session = ort.InferenceSession(int8.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": calib[0]})[0].shape == (1, 10)


def test_calibration_runs_once_per_family_and_says_so(quantizer, calib, caplog) -> None:
    caplog.set_level(logging.INFO, logger="optuna_quant")
    quantizer.quantize(QuantConfig(range_estimator="percentile_99.9"))
    after_first = dict(quantizer.calibration_seconds)
    messages = [r.getMessage() for r in caplog.records]
    # One line before the one-off calibration, one after it with its time.
    assert any(m.startswith(f"Calibrating Percentile on {len(calib)} samples") for m in messages), messages
    assert messages[-1].startswith("Calibrated percentile_99.9 in ") and messages[-1].endswith(" s"), messages
    caplog.clear()
    quantizer.quantize(QuantConfig(range_estimator="percentile_99.9", per_channel=False, activation_symmetric=True))
    quantizer.quantize(QuantConfig(range_estimator="percentile_99.9", fallback=frozenset({"conv1"})))
    assert quantizer.calibration_seconds == after_first
    assert caplog.records == []
    # A new percentile reuses the histogram: it adds compute time but no second collection pass.
    quantizer.quantize(QuantConfig(range_estimator="percentile_99.999"))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and messages[0].startswith("Calibrated percentile_99.999 in ")
    assert set(quantizer.calibration_seconds) == set(after_first)
    assert quantizer.calibration_seconds["Percentile"] > after_first["Percentile"]


@pytest.mark.parametrize(
    "method, options",
    [
        (CalibrationMethod.MinMax, {}),
        (CalibrationMethod.Entropy, {"num_bins": ENTROPY_NUM_BINS}),
        (CalibrationMethod.Percentile, {}),
    ],
)
def test_calibration_one_feed_at_a_time_merges_every_feed(quantizer, calib, tmp_path, method, options) -> None:
    feeds = to_feeds(calib[:12], load_model(quantizer.model_path))
    calibrator = create_calibrator(
        quantizer.model_path, augmented_model_path=str(tmp_path / "augmented.onnx"),
        calibrate_method=method, extra_options=options,
    )
    collect(calibrator, feeds, method.name)
    data = np.concatenate([feed["input"] for feed in feeds])
    if method is CalibrationMethod.MinMax:
        low, high = calibrator.compute_data()["input"].range_value
        assert (low.item(), high.item()) == (data.min(), data.max())  # the range of all 12, not the last
        return
    # Histograms: every feed counted, with the overall extremes.
    hist, _, low, high = calibrator.collector.histogram_dict["input"][:4]
    assert (low.item(), high.item()) == (data.min(), data.max())
    if method is CalibrationMethod.Entropy:
        assert hist.sum() == data.size
    else:
        # onnxruntime 1.32's merge of |x| histograms (Percentile is symmetric by default) drops
        # the odd value beyond the widened last bin edge: 19 of 5184 here.
        assert 0.99 * data.size <= hist.sum() <= data.size


def test_every_range_estimator_gives_its_own_ranges(quantizer) -> None:
    highs = {}
    for estimator in RANGE_ESTIMATORS:
        ranges = quantizer.ranges(estimator)
        highs[estimator] = float(np.asarray(ranges["r1"].range_value[1]).reshape(-1)[0])
    assert highs["percentile_99.9"] < highs["percentile_99.999"] <= highs["minmax"] + 1e-6
    # Entropy with 2048 bins is a real third method, not MinMax again.
    assert highs["entropy"] != pytest.approx(highs["minmax"])


def test_quantizing_does_not_change_cached_ranges(quantizer) -> None:
    before = float(np.asarray(quantizer.ranges("minmax")["r1"].range_value[1]).reshape(-1)[0])
    quantizer.quantize(QuantConfig(activation_symmetric=True))
    quantizer.quantize(QuantConfig(activation_symmetric=False))
    assert float(np.asarray(quantizer.ranges("minmax")["r1"].range_value[1]).reshape(-1)[0]) == before


def test_latency_batch_counts_samples_not_feeds(cnn, calib) -> None:
    batched = to_feeds([np.concatenate(calib[:8]), np.concatenate(calib[8:])], load_model(cnn))
    assert batch_of(batched, 1)["input"].shape == (1, 3, 12, 12)
    assert batch_of(batched, 10)["input"].shape == (10, 3, 12, 12)
    np.testing.assert_array_equal(batch_of(batched, 10)["input"][9], calib[9][0])


@pytest.mark.parametrize(
    ("range_estimator", "method", "options"),
    [("entropy", CalibrationMethod.Entropy, {"num_bins": ENTROPY_NUM_BINS}), ("percentile_99.99", CalibrationMethod.Percentile, {})],
)
def test_histograms_one_feed_at_a_time_equal_one_call_on_all_feeds(
    quantizer, calib, tmp_path, range_estimator, method, options
) -> None:
    # onnxruntime's own way: every sample's activations in one collect_data call. Fed one sample
    # at a time from histograms started at the first sample's range, the bins multiplied.
    calibrator = create_calibrator(
        quantizer.model_path, augmented_model_path=str(tmp_path / "augmented.onnx"),
        calibrate_method=method, extra_options=options,
    )
    if method is CalibrationMethod.Percentile:
        calibrator.percentile = 99.99
    calibrator.collect_data(quantizer.calibration_reader())
    want = calibrator.compute_data()
    got = quantizer.ranges(range_estimator)
    assert set(got) == set(want)
    if method is CalibrationMethod.Percentile:
        # The same bins as one call; onnxruntime's merge of later calls drops the odd value past
        # the last edge, so the thresholds agree closely rather than exactly.
        bins = {name: entry[0].size for name, entry in quantizer._histogram.collector.histogram_dict.items()}
        assert bins == {name: entry[0].size for name, entry in calibrator.collector.histogram_dict.items()}
        for name in want:
            np.testing.assert_allclose(got[name].range_value, want[name].range_value, rtol=1e-2)
        return
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name].range_value), np.asarray(want[name].range_value))


def test_entropy_thresholds_log_their_progress(cnn, calib, caplog, monkeypatch) -> None:
    monkeypatch.setattr("optuna_quant.quantization.quantize.PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr("optuna_quant.quantization.quantize._THRESHOLD_GROUP", 3)
    caplog.set_level(logging.INFO, logger="optuna_quant")
    model = load_model(cnn)
    tensors = len(Quantizer(model, to_feeds(calib[:4], model)).ranges("entropy").data)
    progress = [r.getMessage().split(",")[0] for r in caplog.records if "thresholds of" in r.getMessage()]
    assert tensors == 8  # input, c1, r1, c2, r2, gap, flat, logits: a line after each group of 3 but the last
    assert progress == [f"Calibrating entropy: thresholds of {n} / 8 tensors" for n in (3, 6)]


@pytest.mark.parametrize("config", [QuantConfig(), QuantConfig(approach="dynamic", per_channel=True)], ids=["static", "dynamic"])
def test_a_prepared_model_is_quantized_as_it_is_after_its_shapes_were_inferred_again(cnn, calib, config) -> None:
    feeds = to_feeds(calib[:8], cnn)
    prepared = prepare_model(cnn, feeds)
    assert prepared.shapes_inferred  # quant_pre_process ran, and ends with ONNX shape inference
    inferred_again = Quantizer(prepared.prepared, feeds).quantize(config)
    as_prepared = Quantizer(prepared.prepared, feeds, shapes_inferred=True).quantize(config)
    assert as_prepared.graph.node == inferred_again.graph.node
    assert as_prepared.graph.initializer == inferred_again.graph.initializer
    assert not prepare_model(cnn, feeds, pre_process=False).shapes_inferred


def test_the_entropy_thresholds_are_onnxruntimes_to_the_bit(quantizer, calib, tmp_path) -> None:
    calibrator = create_calibrator(
        quantizer.model_path, augmented_model_path=str(tmp_path / "augmented.onnx"),
        calibrate_method=CalibrationMethod.Entropy, extra_options={"num_bins": ENTROPY_NUM_BINS},
    )
    seed_histograms(calibrator, quantizer.ranges("minmax"))
    collect(calibrator, to_feeds(calib[:12], load_model(quantizer.model_path)), "Entropy")
    assert isinstance(calibrator.collector, FastEntropyCollector)
    histograms = calibrator.collector.histogram_dict
    assert len(histograms) >= 5
    for name, histogram in histograms.items():
        ours = entropy_threshold(histogram, calibrator.num_quantized_bins)
        theirs = HistogramCollector.get_entropy_threshold(calibrator.collector, histogram, calibrator.num_quantized_bins)
        assert [np.asarray(v).tobytes() for v in ours] == [np.asarray(v).tobytes() for v in theirs], name


def test_entropy_counts_that_are_not_integers_are_left_to_onnxruntime(quantizer) -> None:
    hist, edges = np.histogram(np.linspace(-1, 1, 4001, dtype=np.float32), 2048, range=(-1, 1))
    histogram = (hist.astype(np.float64), edges, np.float32(-1), np.float32(1))
    with pytest.raises(TypeError, match="integer counts, got float64"):
        entropy_threshold(histogram, 128)
    collector = FastEntropyCollector("entropy", True, 2048, 128, None, None)
    assert collector.get_entropy_threshold(histogram, 128) == HistogramCollector.get_entropy_threshold(collector, histogram, 128)
