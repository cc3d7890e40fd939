"""Per-layer sensitivity on real sessions: the tiny CNN with one tensor made sensitive, and the demo model."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
from onnx import numpy_helper
import pytest

from conftest import CNN_LAYERS
from examples.tiny_cnn import calibration_data
from optuna_quant.model_io import to_feeds
from optuna_quant.quantize import Quantizer
from optuna_quant.sensitivity import choice_scores
from optuna_quant.sensitivity import LayerSensitivity
from optuna_quant.sensitivity import measure_sensitivity
from optuna_quant.sensitivity import revert_order
from optuna_quant.space import quantizable_nodes



def rescale_conv1_outputs(model: onnx.ModelProto, spread: float = 1000.0) -> onnx.ModelProto:
    """``model`` with conv1's output channels scaled by log-uniform factors in [1 / spread, 1] and
    conv2's input channels divided by them: the same function in fp32 (the ReLU between commutes),
    uneven per-channel ranges of the tensor between conv1 and conv2 (see examples/channel_rescaling.py)."""
    rescaled = onnx.ModelProto()
    rescaled.CopyFrom(model)
    inits = {i.name: i for i in rescaled.graph.initializer}
    w1, b1, w2 = (numpy_helper.to_array(inits[name]) for name in ("w1", "b1", "w2"))
    s = np.exp(np.random.default_rng(0).uniform(-np.log(spread), 0.0, len(b1))).astype(np.float32)
    for name, array in (("w1", w1 * s[:, None, None, None]), ("b1", b1 * s), ("w2", w2 / s[None, :, None, None])):
        inits[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))
    return rescaled


def sensitivity_of(model: onnx.ModelProto) -> dict[str, LayerSensitivity]:
    feeds = to_feeds(calibration_data(model), model)
    return measure_sensitivity(model, Quantizer(model, feeds), feeds, CNN_LAYERS, profile_runs=5)


@pytest.fixture(scope="module")
def plain(cnn: onnx.ModelProto) -> dict[str, LayerSensitivity]:
    return sensitivity_of(cnn)


@pytest.fixture(scope="module")
def rescaled(cnn: onnx.ModelProto) -> dict[str, LayerSensitivity]:
    return sensitivity_of(rescale_conv1_outputs(cnn))


def test_the_layers_around_a_rescaled_tensor_become_the_sensitive_ones(plain, rescaled) -> None:
    for layer in ("conv1", "conv2"):  # conv1's int8 output and conv2's int8 input lose the small channels
        assert rescaled[layer].acc_cost > 100 * plain[layer].acc_cost
        assert rescaled[layer].acc_cost > 100 * rescaled["fc"].acc_cost
    # fc's own int8 error is the same: the rescaling does not change the function
    assert rescaled["fc"].acc_cost == pytest.approx(plain["fc"].acc_cost, rel=0.01)
    assert choice_scores(rescaled)["layer:conv1"]["int8"] < choice_scores(plain)["layer:conv1"]["int8"]


def test_every_layer_gets_its_node_time(rescaled) -> None:
    for layer, s in rescaled.items():
        assert s.fp32_ms > 0, f"{layer}: no fp32 node mapped"
        assert s.int8_ms > 0, f"{layer}: no int8 node mapped"


def test_log_lines_before_and_after(cnn, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="optuna_quant.sensitivity"):
        sensitivity_of(cnn)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "Measuring the sensitivity of 3 layers on 16 samples"
    assert messages[-1].startswith("Measured the sensitivity of 3 layers in ")
    assert "unattributed" in messages[-1]


def test_scores_and_order_are_a_prior_over_every_layer(rescaled) -> None:
    scores = choice_scores(rescaled)
    assert set(scores) == {f"layer:{n}" for n in CNN_LAYERS}
    for choice in scores.values():
        assert 0.1 <= choice["int8"] <= 0.9
        assert choice["int8"] + choice["fp32"] == pytest.approx(1.0)
    assert sorted(revert_order(rescaled)) == sorted(CNN_LAYERS)


def test_round_trip_through_json(rescaled) -> None:
    stored = json.loads(json.dumps({n: s.to_dict() for n, s in rescaled.items()}))
    assert {n: LayerSensitivity.from_dict(d) for n, d in stored.items()} == rescaled


def test_bad_arguments_are_refused_before_measuring(cnn) -> None:
    feeds = to_feeds(calibration_data(cnn), cnn)
    quantizer = Quantizer(cnn, feeds)
    with pytest.raises(ValueError, match=r"missing: \['conv9'\]"):
        measure_sensitivity(cnn, quantizer, feeds, ["conv1", "conv9"])
    with pytest.raises(ValueError, match="nodes must name"):
        measure_sensitivity(cnn, quantizer, feeds, [])
    with pytest.raises(ValueError, match="n_samples must be a positive integer"):
        measure_sensitivity(cnn, quantizer, feeds, ["conv1"], n_samples=0)


@pytest.mark.slow
def test_demo_model_ranks_its_rescaled_layers_first() -> None:
    from examples import demo_data
    from examples.demo_model import build_demo_model

    model = onnx.load(str(build_demo_model()))
    feeds = to_feeds(demo_data.calibration(), model)
    sens = measure_sensitivity(model, Quantizer(model, feeds), feeds, quantizable_nodes(model))
    by_cost = sorted(sens, key=lambda n: -sens[n].acc_cost)
    # /4/Conv -> ReLU -> /6/Conv is the pair the demo rescales (examples/demo_model.py)
    assert by_cost[:2] == ["/6/Conv", "/4/Conv"]
    assert sens["/6/Conv"].acc_cost > 100 * max(sens[n].acc_cost for n in by_cost[2:])
    order = revert_order(sens)
    assert order.index("/6/Conv") < order.index("/2/Conv")
    scores = choice_scores(sens)
    assert scores["layer:/6/Conv"]["int8"] < 0.5 < scores["layer:/2/Conv"]["int8"]
