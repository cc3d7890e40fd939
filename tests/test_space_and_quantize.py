from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest

from optuna_quant.model_io import load_model
from optuna_quant.model_io import to_feeds
from optuna_quant.quantize import Quantizer
from optuna_quant.space import QuantConfig
from optuna_quant.space import RANGE_ESTIMATORS
from optuna_quant.space import SearchSpace


@pytest.fixture(scope="module")
def quantizer(cnn, calib) -> Quantizer:
    model = load_model(cnn)
    return Quantizer(model, to_feeds(calib, model))


def test_space_from_graph(cnn) -> None:
    space = SearchSpace.from_model(load_model(cnn))
    assert space.nodes == ("conv1", "conv2", "fc")
    dists = space.distributions()
    assert set(dists) == {"layer:conv1", "layer:conv2", "layer:fc", "range_estimator", "granularity", "mode"}
    assert space.default_params() == {
        "layer:conv1": "int8", "layer:conv2": "int8", "layer:fc": "int8",
        "range_estimator": "minmax", "granularity": "per_channel", "mode": "symmetric",
    }
    assert space.to_config(space.default_params()) == QuantConfig()


def test_scopes_switch_off_and_restrict_nodes(cnn) -> None:
    space = SearchSpace.from_model(load_model(cnn), scopes=["layer", "mode"], nodes=["conv2"])
    assert set(space.distributions()) == {"layer:conv2", "mode"}
    config = space.to_config({"layer:conv2": "fp32", "mode": "asymmetric"})
    assert config == QuantConfig(fallback=frozenset({"conv2"}), symmetric=False)


def test_narrow_keeps_best_as_base(cnn) -> None:
    space = SearchSpace.from_model(load_model(cnn))
    best = QuantConfig(fallback=frozenset({"fc"}), range_estimator="percentile_99.99", per_channel=False)
    narrowed = space.narrow(best, ["range_estimator"])
    assert set(narrowed.distributions()) == {"range_estimator"}
    assert narrowed.to_config({"range_estimator": "entropy"}) == QuantConfig(
        fallback=frozenset({"fc"}), range_estimator="entropy", per_channel=False
    )
    assert SearchSpace.from_dict(narrowed.to_dict()) == narrowed


def test_to_config_rejects_foreign_values(cnn) -> None:
    space = SearchSpace.from_model(load_model(cnn), scopes=["mode"])
    with pytest.raises(ValueError, match="'mode'.*'loose'"):
        space.to_config({"mode": "loose"})


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
        symmetric=params["mode"] == "symmetric",
    )


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


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


def test_calibration_runs_once_per_family(quantizer, monkeypatch) -> None:
    quantizer.quantize(QuantConfig(range_estimator="percentile_99.9"))
    after_first = dict(quantizer.calibration_seconds)
    quantizer.quantize(QuantConfig(range_estimator="percentile_99.9", per_channel=False, symmetric=False))
    quantizer.quantize(QuantConfig(range_estimator="percentile_99.9", fallback=frozenset({"conv1"})))
    assert quantizer.calibration_seconds == after_first
    # A new percentile reuses the histogram: it adds compute time but no second collection pass.
    passes, collect = [], quantizer.calibration_reader
    monkeypatch.setattr(quantizer, "calibration_reader", lambda: passes.append(1) or collect())
    quantizer.quantize(QuantConfig(range_estimator="percentile_99.999"))
    assert passes == []
    assert set(quantizer.calibration_seconds) == set(after_first)
    assert quantizer.calibration_seconds["Percentile"] > after_first["Percentile"]


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
    quantizer.quantize(QuantConfig(symmetric=True))
    quantizer.quantize(QuantConfig(symmetric=False))
    assert float(np.asarray(quantizer.ranges("minmax")["r1"].range_value[1]).reshape(-1)[0]) == before


def test_latency_batch_counts_samples_not_feeds(cnn, calib) -> None:
    from optuna_quant.model_io import batch_of

    batched = to_feeds([np.concatenate(calib[:8]), np.concatenate(calib[8:])], load_model(cnn))
    assert batch_of(batched, 1)["input"].shape == (1, 3, 12, 12)
    assert batch_of(batched, 10)["input"].shape == (10, 3, 12, 12)
    np.testing.assert_array_equal(batch_of(batched, 10)["input"][9], calib[9][0])
