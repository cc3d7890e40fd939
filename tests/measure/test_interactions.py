"""Two adjacent layers that only recover the accuracy together, on real onnxruntime sessions.

The model is the tiny CNN with four convolutions, the tensor between conv2 and conv3 rescaled
per channel (the fp32 function unchanged): conv2's int8 output and conv3's int8 input each
quantize it, so reverting either alone leaves it quantized by the other.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper
import optuna
import pytest

from examples.tiny_cnn import build_cnn
from examples.tiny_cnn import calibration_data
from examples.tiny_cnn import fp32_agreement
import optuna_quant as oq
from optuna_quant.measure.interactions import adjacent_pairs
from optuna_quant.measure.interactions import PairRecovery
from optuna_quant.measure.loss import relative_accuracy_loss
from optuna_quant.measure.sensitivity import LayerSensitivity
from optuna_quant.trial.guidance import Guidance
from optuna_quant.trial.guidance import measure_guidance
from optuna_quant.trial.guidance import prior_for_space
from optuna_quant.trial.scoring import choice_scores
from optuna_quant.trial.scoring import interacting_pairs


LAYERS = ("conv1", "conv2", "conv3", "conv4", "fc")
PAIR = ("conv2", "conv3")
TARGETS = oq.Targets(accuracy_loss=10.0)


def rescaled_between(model: onnx.ModelProto, first: int, spread: float = 1000.0) -> onnx.ModelProto:
    """``model`` with conv<first>'s output channels scaled by log-uniform factors in
    [1 / spread, 1] and the next convolution's input channels divided by them."""
    rescaled = onnx.ModelProto()
    rescaled.CopyFrom(model)
    inits = {i.name: i for i in rescaled.graph.initializer}
    w, b, w_next = (numpy_helper.to_array(inits[f"{kind}{i}"]) for kind, i in (("w", first), ("b", first), ("w", first + 1)))
    s = np.exp(np.random.default_rng(0).uniform(-np.log(spread), 0.0, len(b))).astype(np.float32)
    for name, array in (
        (f"w{first}", w * s[:, None, None, None]),
        (f"b{first}", b * s),
        (f"w{first + 1}", w_next / s[None, :, None, None]),
    ):
        inits[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))
    return rescaled


def interacting(guidance: Guidance) -> list[PairRecovery]:
    """The guidance's interacting pairs under :data:`TARGETS`, as the study's start-up trials find them."""
    return interacting_pairs(
        guidance.layers,
        guidance.pairs,
        acc_loss=guidance.reference_acc_loss,
        accuracy_target=TARGETS.acc_th,
        scope_errors=guidance.scope_errors,
    )


@pytest.fixture(scope="module")
def setting():
    model = rescaled_between(build_cnn(channels=(16, 16, 16, 16)), 2)
    objective = oq.QuantizationObjective(
        model, calibration_data(model), fp32_agreement(model), targets=TARGETS, scopes=("layer",)
    )
    measurer, space = objective.measurer, objective.space
    assert tuple(space.nodes) == LAYERS

    def acc_loss(params) -> float:
        return relative_accuracy_loss(measurer.baseline(), measurer.accuracy(space.to_config(params)))

    guidance = measure_guidance(measurer, space, acc_loss(space.default_params()), TARGETS)
    return space, guidance, acc_loss


def test_only_the_joint_revert_recovers_the_accuracy(setting) -> None:
    space, guidance, acc_loss = setting
    default = space.default_params()
    reverted = lambda *layers: {**default, **{f"layer:{n}": "fp32" for n in layers}}  # noqa: E731
    assert acc_loss(default) > 5 * TARGETS.acc_th
    assert acc_loss(reverted("conv2")) > TARGETS.acc_th and acc_loss(reverted("conv3")) > TARGETS.acc_th
    assert acc_loss(reverted(*PAIR)) <= TARGETS.acc_th
    # One layer at a time, neither revert recovers much of the output error.
    base_error = sum(s.error_alone for s in guidance.layers.values())
    assert all(guidance.layers[n].error_recovered < 0.25 * base_error for n in PAIR)
    assert [p.layers for p in interacting(guidance)] == [PAIR]


@pytest.mark.parametrize("sampler_class", [oq.DiscreteGPSampler, oq.TPESampler])
def test_the_prior_finds_the_pair_within_five_trials(setting, sampler_class) -> None:
    """A study steered by the measured prior alone (no queued trials, as a table replay) meets
    the accuracy target, which needs conv2 and conv3 in fp32 together, within five trials. Each
    layer in fp32 costs a little loss, the latency target's stand-in (tests do not time)."""
    space, guidance, acc_loss = setting
    sampler = sampler_class(seed=0)
    sampler.set_prior(prior_for_space(guidance, space.distributions(), TARGETS))

    def objective(trial: optuna.Trial) -> float:
        params = space.suggest(trial)
        loss = acc_loss(params)
        trial.set_user_attr("met", loss <= TARGETS.acc_th)
        return loss + (0 if loss <= TARGETS.acc_th else 1) + 0.01 * list(params.values()).count("fp32")

    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=5)
    met = [t for t in study.trials if t.user_attrs["met"]]
    assert met, [t.params for t in study.trials]
    assert all(t.params[f"layer:{n}"] == "fp32" for t in met for n in PAIR)


def test_the_pair_is_the_first_start_up_trial(setting) -> None:
    # Layers only: the all-int8 base is the reference, which is not queued again.
    space, guidance, _ = setting
    first = guidance.startup_params(space.distributions(), 5, TARGETS)[0]
    assert {n for n in LAYERS if first[f"layer:{n}"] == "fp32"} == set(PAIR)


def test_adjacent_layers_follow_the_data_through_relu_and_pooling() -> None:
    model = build_cnn(channels=(16, 16))
    units = {n: (n,) for n in ("conv1", "conv2", "fc")}
    assert adjacent_pairs(model, units) == [("conv1", "conv2"), ("conv2", "fc")]
    assert adjacent_pairs(model, {"conv1": ("conv1",), "fc": ("fc",)}) == [("conv1", "fc")]


def test_a_pair_that_a_single_revert_explains_is_no_interaction() -> None:
    sens = {"a": LayerSensitivity(0.01, -0.009, 1, 1, 0.1), "b": LayerSensitivity(0.1, 0.09, 1, 1, 0.1)}
    assert interacting_pairs(sens, [PairRecovery(("a", "b"), 0.1)], acc_loss=0.5, accuracy_target=0.01) == []


def test_a_pair_that_recovers_a_negligible_error_is_no_interaction() -> None:
    """All that the pair recovers is interaction, but 0.0002 of an all-int8 error of 0.005 (4 %):
    0.4 of the 1 % target at a 10 % loss, 0.016 of it (under MATERIAL_BENEFIT) at a 0.4 % loss."""
    sens = {"a": LayerSensitivity(0.003, -0.001, 1, 1, 0.1), "b": LayerSensitivity(0.002, -0.02, 1, 1, 0.1)}
    pair = PairRecovery(("a", "b"), 0.0002)
    assert interacting_pairs(sens, [pair], acc_loss=0.1, accuracy_target=0.01) == [pair]
    assert interacting_pairs(sens, [pair], acc_loss=0.004, accuracy_target=0.01) == []
    # Predicted at the lowest-error combination, a tenth of the reference's error: 0.016 of a target.
    errors = [{"params": {"g": "t"}, "error": 0.05}, {"params": {"g": "c"}, "error": 0.005}]
    assert interacting_pairs(sens, [pair], acc_loss=0.04, accuracy_target=0.01, scope_errors=errors) == []
    # The prior and the start-up trials leave both layers as one layer at a time scores them.
    scores = choice_scores(sens, acc_loss=0.004, accuracy_target=0.01, pairs=[pair])
    assert scores == choice_scores(sens, acc_loss=0.004, accuracy_target=0.01)
