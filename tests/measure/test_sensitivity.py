"""Per-layer sensitivity on real sessions: the tiny CNN with one tensor made sensitive, and the demo model."""

from __future__ import annotations

import json
import logging

from conftest import CNN_LAYERS
import numpy as np
import onnx
from onnx import numpy_helper
import pytest

from examples.tiny_cnn import build_cnn
from examples.tiny_cnn import calibration_data
import optuna_quant as oq
from optuna_quant.measure.cpu import int8_support
from optuna_quant.measure.interactions import measure_pairs
from optuna_quant.measure.sensitivity import LayerSensitivity
from optuna_quant.measure.sensitivity import lowest_error
from optuna_quant.measure.sensitivity import measure_scope_errors
from optuna_quant.measure.sensitivity import measure_sensitivity
from optuna_quant.quantization.config import quantizable_nodes
from optuna_quant.quantization.config import WEIGHT_TYPES
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.trial.budget import scope_combinations
from optuna_quant.trial.guidance import Guidance
from optuna_quant.trial.guidance import measure_space
from optuna_quant.trial.scoring import choice_scores
from optuna_quant.trial.scoring import revert_order
from optuna_quant.trial.scoring import scope_scores
from optuna_quant.trial.space import SearchSpace


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


def test_every_layer_gets_its_node_time_and_revert_cost(plain, rescaled) -> None:
    for sens in (plain, rescaled):
        for layer, s in sens.items():
            assert s.fp32_ms > 0, f"{layer}: no fp32 node mapped"
            assert s.int8_ms > 0, f"{layer}: no int8 node mapped"
            assert -1 < s.revert_cost < 1, f"{layer}: revert_cost {s.revert_cost}"
        # conv2 (16 x 8 x 3 x 3 on 8 x 8) is most of the int8 work; fc's revert costs far less
        # (about 0.19 against -0.07 of the speed-up, unloaded): a margin no contention closes.
        assert sens["conv2"].revert_cost > sens["fc"].revert_cost + 0.05


def test_layers_named_as_prefixes_of_each_other_get_their_own_time() -> None:
    """The exporter's names (``node_conv``, ``node_conv_1``) prefix one another: onnxruntime's
    fused ``node_conv_1_token_<n>`` once went to ``node_conv``, and an unsearched layer's nodes
    to a searched one whose name prefixes it."""
    model = build_cnn(channels=(32, 32), image_size=28)
    for node, new in zip(model.graph.node, ("node_conv", "relu1", "node_conv_1")):
        node.name = new
    feeds = to_feeds(calibration_data(model), model)
    quantizer = Quantizer(model, feeds)
    both = measure_sensitivity(model, quantizer, feeds, ["node_conv", "node_conv_1"], profile_runs=5, revert_timing=None)
    assert both["node_conv_1"].int8_ms > 0.0 and both["node_conv_1"].revert_cost is None
    # node_conv_1 unsearched: its time is not node_conv's.
    alone = measure_sensitivity(model, quantizer, feeds, ["node_conv"], profile_runs=5, revert_timing=None)
    assert alone["node_conv"].int8_ms < both["node_conv"].int8_ms + both["node_conv_1"].int8_ms / 2


def test_log_lines_before_and_after(cnn, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="optuna_quant.measure.sensitivity"):
        sensitivity_of(cnn)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "Measuring the sensitivity of 3 layers on 16 samples, timed on a batch of 1"
    assert messages[-1].startswith("Measured the sensitivity of 3 layers in ")
    assert "timings of each revert and each layer alone" in messages[-1] and "unattributed" in messages[-1]


def test_a_study_times_the_layers_on_the_input_it_times_its_trials_on(
    cnn_path, calib, agreement, fast_bench, tmp_path, caplog
) -> None:
    """Calibration data in batches of 8: the study times its trials on one sample (batch_size 1),
    and so must the revert timings and profiles, since what a layer's int8 saves depends on the
    input's size (silero-vad's output layer, docs/real-models.md). They once ran on the first
    calibration feed."""
    batches = [np.concatenate(calib[i : i + 8]) for i in range(0, len(calib), 8)]
    study = oq.create_study(
        cnn_path, batches, agreement, sampler="random", seed=0, storage=f"sqlite:///{tmp_path}/study.db",
        benchmark=fast_bench, sensitivity="full",
    )
    with caplog.at_level(logging.INFO, logger="optuna_quant.measure.sensitivity"):
        study.optimize(n_trials=2)  # measured between the reference and the next trial
    assert [len(feed) for feed in study.objective.measurer.latency_feed.values()] == [1]
    measuring = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Measuring the sensitivity")]
    assert measuring == [f"Measuring the sensitivity of {len(CNN_LAYERS)} layers on {len(batches)} samples, timed on a batch of 1"]


@pytest.fixture(scope="module")
def rescaled_scope_errors(cnn: onnx.ModelProto) -> list[dict]:
    model = rescale_conv1_outputs(cnn)
    feeds = to_feeds(calibration_data(model), model)
    space = SearchSpace.from_model(model)
    combinations = scope_combinations(space.distributions())
    return measure_scope_errors(
        model, Quantizer(model, feeds), feeds, combinations, lambda p: space.to_config({**space.default_params(), **p})
    )


def test_scope_errors_point_away_from_what_the_rescaling_breaks(cnn, rescaled_scope_errors) -> None:
    errors = rescaled_scope_errors
    space = SearchSpace.from_model(cnn)
    assert len(errors) == 5 * 2 * 2 * 2 * len(space.op_types) * 2
    assert errors[0]["params"] == {k: v for k, v in space.default_params().items() if not k.startswith("layer:")}
    assert lowest_error(errors)["params"]["granularity"] == "per_channel"
    scores = scope_scores(errors)
    assert set(scores) == {"range_estimator", "granularity", "activation_mode", "weight_mode", "op_types", "equalization"}
    assert all(0.1 <= p <= 0.9 for by_choice in scores.values() for p in by_choice.values())
    # One scale for conv1's weights, whose channels span 1000x, loses the small ones ...
    unequalized = scope_scores([e for e in errors if e["params"]["equalization"] == "off"])
    assert unequalized["granularity"]["per_channel"] == 0.9 and unequalized["granularity"]["per_tensor"] < 0.5
    # ... which equalizing conv1 with conv2 gives back.
    assert scores["equalization"]["on"] == 0.9 and scores["equalization"]["off"] < 0.5
    assert scores["granularity"]["per_tensor"] > unequalized["granularity"]["per_tensor"]


def test_choice_scores_are_a_prior_over_every_parameter(rescaled, rescaled_scope_errors) -> None:
    scores = choice_scores(rescaled, acc_loss=0.05, accuracy_target=0.01, scope_errors=rescaled_scope_errors)
    assert set(scores) == {f"layer:{n}" for n in CNN_LAYERS} | set(scope_scores(rescaled_scope_errors))
    for node in CNN_LAYERS:
        choice = scores[f"layer:{node}"]
        assert 0.05 <= choice["fp32"] <= 0.95 and choice["int8"] + choice["fp32"] == pytest.approx(1.0)
    # Measured at the reference (no scope errors), the predicted loss is the reference's, 0.05,
    # not the lowest combination's (lower): a revert that recovers error buys more there.
    layers_only = choice_scores(rescaled, acc_loss=0.05, accuracy_target=0.01)
    assert set(layers_only) == {f"layer:{n}" for n in CNN_LAYERS}
    recovering = [n for n in CNN_LAYERS if rescaled[n].error_recovered > 0]
    assert recovering and all(layers_only[f"layer:{n}"]["fp32"] > scores[f"layer:{n}"]["fp32"] for n in recovering)
    assert sorted(revert_order(rescaled)) == sorted(CNN_LAYERS)


def test_measure_space_measures_the_layers_at_the_lowest_error(cnn) -> None:
    model = rescale_conv1_outputs(cnn)
    feeds = to_feeds(calibration_data(model), model)
    quantizer = Quantizer(model, feeds)
    space = SearchSpace.from_model(model, scopes=("layer", "granularity", "range_estimator"))
    errors, sens, pairs = measure_space(model, quantizer, feeds, space, profile_runs=5)
    assert [e["params"] for e in errors] == scope_combinations(space.distributions())
    # One timing per set of kernels: the range estimators change only the scales.
    timed = {g: {e["lat_diff"] for e in errors if e["params"]["granularity"] == g} for g in ("per_channel", "per_tensor")}
    assert all(len(readings) == 1 and 0 < next(iter(readings)) < np.inf for readings in timed.values())
    best = lowest_error(errors)["params"]
    base_config = space.to_config({**space.default_params(), **best})
    at_best = measure_sensitivity(model, quantizer, feeds, CNN_LAYERS, base_config=base_config, profile_runs=5, revert_timing=None)
    assert {n: s.error_alone for n, s in sens.items()} == {n: s.error_alone for n, s in at_best.items()}
    # The pairs from the fp32 outputs and the lowest scope error measure_space had: as measured afresh.
    assert pairs == measure_pairs(model, quantizer, feeds, space.units(), sens, base_config=base_config)
    assert set(choice_scores(sens, acc_loss=0.05, accuracy_target=0.01, scope_errors=errors)) == set(space.distributions())


def test_weight_types_are_measured_one_at_a_time_at_the_lowest_error(cnn) -> None:
    """On a CPU whose int8 kernels saturate, weight_type's other two choices cost two models, not
    twice the combinations: each at the lowest-error combination of the other scopes."""
    model = rescale_conv1_outputs(cnn)
    feeds = to_feeds(calibration_data(model), model)
    quantizer = Quantizer(model, feeds)
    space = SearchSpace.from_model(model, scopes=("granularity", "range_estimator", "weight_type"), int8_class="x86-avx2")
    assert space.distributions()["weight_type"].choices == WEIGHT_TYPES
    errors, sens, pairs = measure_space(model, quantizer, feeds, space)
    combinations = scope_combinations(space.distributions(), ["weight_type"])
    assert [e["params"] for e in errors[: len(combinations)]] == combinations
    assert all(params["weight_type"] == "int8" for params in combinations) and len(combinations) == 2 * 5
    best = lowest_error(errors[: len(combinations)])["params"]
    assert [e["params"] for e in errors[len(combinations) :]] == [{**best, "weight_type": t} for t in WEIGHT_TYPES[1:]]
    assert all(e["error"] > 0 for e in errors) and (sens, pairs) == ({}, [])
    assert set(scope_scores(errors)["weight_type"]) == set(WEIGHT_TYPES)


def test_choice_scores_follow_gain_and_cost() -> None:
    # a recovers most of the error at no cost; b recovers nothing and costs 40 % of the speed-up.
    sens = {"a": LayerSensitivity(0.2, 0.15, 0.2, 0.1, 0.0), "b": LayerSensitivity(0.01, 0.0, 1.0, 0.2, 0.4)}
    scores = choice_scores(sens, acc_loss=0.02, accuracy_target=0.01)
    assert scores["layer:a"]["fp32"] > 0.9 > 0.2 > scores["layer:b"]["fp32"]
    # A loss ten times lower (the lowest-error combination's) leaves a's revert less to buy.
    errors = [{"params": {"g": "x"}, "error": 0.1}, {"params": {"g": "y"}, "error": 0.01}]
    lower = choice_scores(sens, acc_loss=0.02, accuracy_target=0.01, scope_errors=errors)
    assert 0.5 < lower["layer:a"]["fp32"] < scores["layer:a"]["fp32"]
    assert lower["g"] == {"x": 0.1, "y": 0.9}
    # int8 loses nothing at the reference: neither a revert nor a lower-error choice buys anything.
    spare = choice_scores(sens, acc_loss=-0.03, accuracy_target=0.01, scope_errors=errors)
    assert spare["g"] == {"x": 0.9, "y": 0.9} and spare["layer:a"]["fp32"] == spare["layer:b"]["fp32"] == 0.05
    # ... unless the revert may buy speed: timed as free, and its int8 kernel profiles slower than fp32's.
    slower = {"c": LayerSensitivity(0.01, 0.0, 0.1, 0.2, 0.01), "d": LayerSensitivity(0.01, 0.0, 0.1, 0.2, 0.1)}
    free = choice_scores(slower, acc_loss=-0.03, accuracy_target=0.01)
    assert free["layer:c"]["fp32"] > 0.15 and free["layer:d"]["fp32"] == 0.05  # d's revert costs 10 %: resolved
    # A timed saving within the resolution is counted once: it buys the resolution, as one just beyond it.
    within, beyond = LayerSensitivity(0.01, 0.0, 0.1, 0.2, -0.029), LayerSensitivity(0.01, 0.0, 0.1, 0.2, -0.031)
    scored = choice_scores({"e": within, "f": beyond}, acc_loss=-0.03, accuracy_target=0.01)
    assert abs(scored["layer:e"]["fp32"] - scored["layer:f"]["fp32"]) < 0.01
    with pytest.raises(ValueError, match=r"Layers \['a'\] have no revert_cost"):
        choice_scores({"a": LayerSensitivity(0.2, 0.15, 0.1, 0.2)}, acc_loss=0.02, accuracy_target=0.01)
    with pytest.raises(ValueError, match="accuracy_target must be a positive fraction, got 0"):
        choice_scores(sens, acc_loss=0.02, accuracy_target=0)


def test_revert_order_uses_the_timed_revert_cost() -> None:
    # By profile, a saves more than b; timed end to end, reverting a costs nothing.
    sens = {"a": LayerSensitivity(0.01, 0.01, 1.0, 0.2, -0.01), "b": LayerSensitivity(0.02, 0.02, 0.3, 0.2, 0.3)}
    assert revert_order(sens) == ["a", "b"]
    assert revert_order({n: LayerSensitivity(s.error_alone, s.error_recovered, s.fp32_ms, s.int8_ms) for n, s in sens.items()}) == ["b", "a"]


def test_round_trip_through_json(rescaled) -> None:
    stored = json.loads(json.dumps({n: s.to_dict() for n, s in rescaled.items()}))
    assert {n: LayerSensitivity.from_dict(d) for n, d in stored.items()} == rescaled
    # A measurement stored before revert_cost and alone_speedup existed still loads.
    old = {k: v for k, v in rescaled["fc"].to_dict().items() if k not in ("revert_cost", "alone_speedup")}
    assert LayerSensitivity.from_dict(old).revert_cost is None and LayerSensitivity.from_dict(old).alone_speedup is None


def test_each_layer_is_timed_from_both_ends(plain) -> None:
    """A speed-up of the model with only that layer int8 over fp32: a ratio of two timings near
    each other, so within a factor of 3 of 1 however loaded the machine is."""
    assert all(s.alone_speedup is not None and 1 / 3 < s.alone_speedup < 3 for s in plain.values())
    assert all(s.revert_cost is not None for s in plain.values())


def _guidance(**alone_speedup: float | None) -> Guidance:
    """Layers conv1 (most harmful), conv2, fc (least), timed from the fp32 end as given."""
    harm = {"conv1": 0.3, "conv2": 0.2, "fc": 0.1}
    layers = {n: LayerSensitivity(harm[n], harm[n], 1.0, 0.5, 0.1, alone_speedup.get(n)) for n in harm}
    errors = [{"params": {"granularity": "per_channel"}, "error": 0.2}, {"params": {"granularity": "per_tensor"}, "error": 0.1}]
    return Guidance(layers, errors, reference_acc_loss=0.02)


def test_start_up_trials_come_from_both_ends() -> None:
    space = SearchSpace(("conv1", "conv2", "fc"), scopes=frozenset({"layer", "granularity"})).distributions()
    fp32 = lambda params: [n for n in ("conv1", "conv2", "fc") if params[f"layer:{n}"] == "fp32"]  # noqa: E731
    # Only fc pays alone: the second trial keeps conv1 and conv2 in fp32 together.
    first = _guidance(conv1=0.8, conv2=0.9, fc=1.1).startup_params(space, 5, oq.Targets())
    assert [fp32(p) for p in first] == [[], ["conv1", "conv2"], ["conv1"]]  # the second revert is the second trial
    assert all(p["granularity"] == "per_tensor" for p in first)  # the lowest-error combination
    # All pay alone (the base again), none does (the fp32 model), or not timed: no such trial.
    for timed in (dict(conv1=1.2, conv2=1.1, fc=1.3), dict(conv1=0.9, conv2=0.8, fc=0.7), {}):
        assert [fp32(p) for p in _guidance(**timed).startup_params(space, 5, oq.Targets())] == [[], ["conv1"], ["conv1", "conv2"]]
    # The same configuration twice is queued once: conv1 alone slower is the first revert too.
    assert [fp32(p) for p in _guidance(conv1=0.9, conv2=1.1, fc=1.1).startup_params(space, 5, oq.Targets())] == [[], ["conv1"], ["conv1", "conv2"]]


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
    # Without int8 dot-product instructions onnxruntime's u8s8 kernels saturate 16-bit sums, which
    # costs every layer some accuracy (under AVX2 emulation the others reached 0.024, /6/Conv 0.378).
    dominance = 100 if int8_support().dot_product else 10
    assert sens["/6/Conv"].acc_cost > dominance * max(sens[n].acc_cost for n in by_cost[2:])
    assert all(s.revert_cost is not None for s in sens.values())
    # Which reverts cost speed is the CPU's: with AMX the model ran faster with /0, /2 or /4 in
    # fp32, with AVX512-VNNI /2's int8 paid. Those reverts come first, then /6/Conv, the
    # costliest per time its int8 saves.
    order = revert_order(sens)
    pays = [n for n in order if sens[n].revert_cost > 0]
    assert order == [n for n in order if n not in pays] + pays and pays[0] == "/6/Conv"

