"""The prior of any search space from a measured sensitivity: part of the parameters, part of the choices."""

from __future__ import annotations

import dataclasses

import onnx
import optuna
from optuna.distributions import CategoricalDistribution as C
import pytest

from examples.tiny_cnn import calibration_data
from examples.tiny_cnn import fp32_agreement
import optuna_quant as oq
from optuna_quant.measure.interactions import PairRecovery
from optuna_quant.measure.sensitivity import LayerSensitivity
from optuna_quant.trial import guidance as guidance_module
from optuna_quant.trial.guidance import Guidance
from optuna_quant.trial.scoring import choice_scores
from optuna_quant.trial.space import SearchSpace


TARGETS = oq.Targets(accuracy_loss=1.0)
LAYER = C(["int8", "fp32"])
SPACE = {"layer:a": LAYER, "layer:b": LAYER, "layer:c": LAYER, "granularity": C(["pc", "pt"]), "mode": C(["asym", "sym"])}


def _guidance(pairs: tuple[PairRecovery, ...] = ()) -> Guidance:
    layers = {
        "a": LayerSensitivity(0.010, -0.004, 1.0, 0.5, 0.1),
        "b": LayerSensitivity(0.100, 0.008, 1.0, 0.5, 0.1),
        "c": LayerSensitivity(0.005, 0.004, 1.0, 0.5, 0.1),
    }
    errors = [
        {"params": {"granularity": g, "mode": m}, "error": e}
        for (g, m), e in {("pc", "asym"): 0.2, ("pt", "asym"): 0.4, ("pc", "sym"): 0.05, ("pt", "sym"): 0.1}.items()
    ]
    return Guidance(layers, errors, reference_acc_loss=0.03, pairs=pairs)


def test_the_whole_space_gets_what_choice_scores_gives() -> None:
    guidance = _guidance()
    expected = choice_scores(guidance.layers, acc_loss=0.03, accuracy_target=0.01, scope_errors=guidance.scope_errors)
    assert oq.prior_for_space(guidance, SPACE, TARGETS) == expected


def test_a_restricted_space_gets_the_prior_of_its_own_parameters_and_choices() -> None:
    guidance = _guidance()
    # mode is switched off (at the reference's asym), and one layer is left out.
    space = {"layer:a": LAYER, "granularity": C(["pc", "pt"])}
    prior = oq.prior_for_space(guidance, space, TARGETS)
    assert set(prior) == {"layer:a", "granularity"}
    # Scored among the asym combinations only: pt's error is twice pc's there.
    assert prior["granularity"] == {"pc": 0.9, "pt": 0.5}
    # Fixed elsewhere, the loss is predicted at the first combination held, (pc, sym): 0.03 x
    # 0.05 / 0.2, within the target, so pt is scored by its predicted loss against the target,
    # 0.01 / (0.0075 x 2), as for a reference that meets it (scoring.scope_scores).
    at_sym = oq.prior_for_space(guidance, space, TARGETS, fixed={"mode": "sym"})
    assert at_sym["granularity"] == {"pc": 0.9, "pt": 0.6667}
    assert at_sym["layer:a"] == prior["layer:a"]  # a's revert buys nothing at either
    # A parameter narrowed to some of its choices gets scores for those only.
    narrowed = oq.prior_for_space(guidance, {"mode": C(["sym"]), "granularity": C(["pt"])}, TARGETS)
    assert narrowed == {"mode": {"sym": 0.9}, "granularity": {"pt": 0.9}}


def test_a_narrower_space_rescales_the_loss_the_layers_share_out() -> None:
    guidance = _guidance()
    full = oq.prior_for_space(guidance, {"layer:b": LAYER, "mode": C(["asym", "sym"])}, TARGETS)
    # Symmetric only: the first combination held has a quarter of the reference's error.
    sym = oq.prior_for_space(guidance, {"layer:b": LAYER, "mode": C(["sym"])}, TARGETS)
    assert full["layer:b"] == sym["layer:b"]  # both measured at the same lowest-error combination
    asym = oq.prior_for_space(guidance, {"layer:b": LAYER, "mode": C(["asym"])}, TARGETS)
    assert asym["layer:b"]["fp32"] > full["layer:b"]["fp32"]  # four times the loss left to buy back


def test_a_pair_counts_only_where_the_space_searches_both_layers() -> None:
    guidance = _guidance(pairs=(PairRecovery(("a", "b"), 0.1),))
    both = oq.prior_for_space(guidance, {"layer:a": LAYER, "layer:b": LAYER}, TARGETS)
    assert both["layer:a"]["fp32"] > 0.9 and both["layer:b"]["fp32"] > 0.9
    alone = oq.prior_for_space(guidance, {"layer:a": LAYER}, TARGETS)
    assert alone["layer:a"]["fp32"] == 0.05  # its own revert adds error


def _measured(space: dict, params: dict, acc_loss: float) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(value=0.0, params=params, distributions=space, user_attrs={"acc_loss": acc_loss})


def test_a_base_predicted_to_miss_the_accuracy_target_and_measured_within_it_leaves_no_loss_to_buy_back() -> None:
    # The reference's 10 % at (pc, asym) predicts 2.5 % at the lowest-error (pc, sym): the target missed.
    guidance = dataclasses.replace(_guidance(), reference_acc_loss=0.1)
    base = guidance.base_params(SPACE, TARGETS)
    assert base == {"layer:a": "int8", "layer:b": "int8", "layer:c": "int8", "granularity": "pc", "mode": "sym"}
    assert guidance.predicts_base_misses(TARGETS) and guidance.startup_params(SPACE, 1, TARGETS) == [base]
    elsewhere = _measured(SPACE, {**base, "granularity": "pt"}, -0.01)
    assert guidance.measured_at_base(SPACE, TARGETS, [elsewhere]) is guidance  # predicted until measured
    assert guidance.measured_at_base(SPACE, TARGETS, [_measured(SPACE, base, 0.02)]) is guidance  # a miss confirmed
    within = guidance.measured_at_base(SPACE, TARGETS, [elsewhere, _measured(SPACE, base, -0.005)])
    assert within == dataclasses.replace(guidance, base_acc_loss=-0.005)
    predicted, measured = oq.prior_for_space(guidance, SPACE, TARGETS), oq.prior_for_space(within, SPACE, TARGETS)
    assert predicted["layer:b"]["fp32"] > predicted["layer:b"]["int8"]  # b's revert would buy back the predicted loss
    assert all(measured[f"layer:{node}"]["int8"] > measured[f"layer:{node}"]["fp32"] for node in "abc")
    # The other scopes keep the prediction: a loss within noise says nothing of 4 times the error.
    assert all(measured[name] == predicted[name] for name in ("granularity", "mode"))
    # A prediction within the target stands, whatever the base measured (docs/benchmarks.md).
    meeting = _guidance()
    assert not meeting.predicts_base_misses(TARGETS)
    measured_miss = _measured(SPACE, meeting.base_params(SPACE, TARGETS), 0.05)
    assert meeting.measured_at_base(SPACE, TARGETS, [measured_miss]) is meeting


def test_a_sampler_that_takes_no_start_up_trials_gets_the_base_where_the_prior_predicts_it_misses() -> None:
    missing, meeting = dataclasses.replace(_guidance(), reference_acc_loss=0.1), _guidance()
    gp, tpe = oq.DiscreteGPSampler(seed=0), oq.TPESampler(seed=0)
    base = missing.base_params(SPACE, TARGETS)
    assert guidance_module.queued_params(missing, gp, 40, SPACE, TARGETS) == [base]
    assert guidance_module.queued_params(meeting, gp, 40, SPACE, TARGETS) == []
    assert guidance_module.queued_params(missing, gp, 4, SPACE, TARGETS) == []  # no room for a start-up trial
    assert guidance_module.queued_params(missing, tpe, 40, SPACE, TARGETS) == missing.startup_params(SPACE, 5, TARGETS)
    # The base at the reference's own combination is the reference, measured already.
    lowest_first = [{**entry, "error": 0.01 if i == 0 else 0.5} for i, entry in enumerate(missing.scope_errors)]
    at_reference = dataclasses.replace(missing, scope_errors=lowest_first)
    assert at_reference.predicts_base_misses(TARGETS)
    assert guidance_module.queued_params(at_reference, gp, 40, SPACE, TARGETS) == []


def test_pairs_survive_the_study_records() -> None:
    guidance = _guidance(pairs=(PairRecovery(("a", "b"), 0.1),))
    assert Guidance.from_records(*guidance.to_records()) == guidance
    layers, rest = guidance.to_records()
    del rest["pairs"]  # stored before pairs were measured
    assert Guidance.from_records(layers, rest).pairs == ()


def test_a_study_restricted_by_scopes_and_nodes_gives_its_sampler_that_space_prior(cnn: onnx.ModelProto, tmp_path) -> None:
    study = oq.create_study(
        cnn,
        calibration_data(cnn),
        fp32_agreement(cnn),
        scopes=("layer", "granularity"),
        nodes=["conv2", "fc"],
        sampler="gp",
        seed=0,
        storage=f"sqlite:///{tmp_path}/study.db",
        benchmark={"warmup": 1, "blocks": 2, "min_seconds": 0.02},
        sensitivity="full",
    )
    study.optimize(n_trials=3)
    prior = study.study.sampler._prior
    assert set(prior) == {"layer:conv2", "layer:fc", "granularity"}
    assert set(prior["layer:conv2"]) == set(prior["layer:fc"]) == {"int8", "fp32"}
    assert set(prior["granularity"]) == {"per_channel", "per_tensor"}
    stored = guidance_module.stored(study.study)
    assert set(stored.layers) == {"conv2", "fc"}
    assert all(set(entry["params"]) == {"granularity"} for entry in stored.scope_errors)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_the_faster_kernels_lead_among_the_choices_the_accuracy_target_allows() -> None:
    """Per-channel weights quantize with half the output error of per-tensor ones, per-tensor
    kernels run 6 % faster (two timing spreads): per tensor leads where its predicted loss meets
    the accuracy target, per channel where it does not (mlp's case, docs/benchmarks.md) or where
    the two run alike."""
    layers = {node: LayerSensitivity(0.01, 0.005, 1.0, 0.5, 0.1) for node in ("a", "b")}
    errors = [
        {"params": {"granularity": "per_channel"}, "error": 0.05},
        {"params": {"granularity": "per_tensor"}, "error": 0.1},
    ]
    timed = Guidance(layers, [{**errors[0], "lat_diff": 1.0}, {**errors[1], "lat_diff": 1.06}], 0.004)
    tied = dataclasses.replace(timed, scope_errors=[{**entry, "lat_diff": 1.0} for entry in errors])
    missing = dataclasses.replace(timed, reference_acc_loss=0.008)  # per tensor predicted at 1.6 %
    space = SearchSpace(nodes=("a", "b"), scopes=frozenset({"layer", "granularity"}))
    prior = timed.prior(TARGETS, space)["granularity"]
    assert prior["per_tensor"] == 0.9 and prior["per_channel"] < 0.5
    assert tied.prior(TARGETS, space)["granularity"] == {"per_channel": 0.9, "per_tensor": 0.9}
    assert missing.prior(TARGETS, space)["granularity"] == {"per_channel": 0.9, "per_tensor": 0.625}
    # The start-up trials start from the faster kernels where the target allows them.
    assert timed.startup_params(space.distributions(), 3, TARGETS)[0]["granularity"] == "per_tensor"
    for guidance in (tied, missing):
        assert guidance.startup_params(space.distributions(), 3, TARGETS)[0]["granularity"] == "per_channel"


def test_start_up_trials_that_build_one_model_are_queued_once() -> None:
    # Under dynamic only a's layer choice builds another model: b and c are convolutions, say.
    space = SearchSpace(
        nodes=("a", "b", "c"), scopes=frozenset({"layer", "granularity", "approach"}),
        approaches=("dynamic", "static"), dynamic_nodes=("a",),
    )
    errors = {("per_channel", "dynamic"): 0.2, ("per_tensor", "dynamic"): 0.05, ("per_channel", "static"): 0.3, ("per_tensor", "static"): 0.4}
    guidance = dataclasses.replace(
        _guidance(),
        scope_errors=[{"params": {"granularity": g, "approach": a}, "error": e} for (g, a), e in errors.items()],
    )
    distributions = space.distributions()
    by_params = guidance.startup_params(distributions, 5, TARGETS)
    by_model = guidance.startup_params(distributions, 5, TARGETS, space.to_config)
    assert all(p["approach"] == "dynamic" and p["granularity"] == "per_tensor" for p in by_params)
    assert len({space.to_config(p) for p in by_params}) < len(by_params)  # reverting b or c alone repeats a model
    assert len({space.to_config(p) for p in by_model}) == len(by_model) == 2
    assert {p["layer:a"] for p in by_model} == {"int8", "fp32"}
    tpe = oq.TPESampler(seed=0)
    assert guidance_module.queued_params(guidance, tpe, 40, distributions, TARGETS, space.to_config) == by_model
