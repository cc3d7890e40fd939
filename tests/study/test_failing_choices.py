"""A choice, or a pair of choices, that fails on a model is learnt once: the study stores it, its
samplers never draw it again, and a trial that another sampler gives it fails at once, unmeasured.

The failures are real: an ``eval_fn`` whose deployment has no int8 GlobalAveragePool raises on
every model that quantizes one (Q/DQ on its output), which on the tiny CNN is what
``op_types: all`` (and only it) does; one that refuses only a signed int8 GlobalAveragePool
raises where ``op_types: all`` meets symmetric (int8) activations, and on neither alone. The sensitivity's own failures are real too: a combination whose configuration cannot
be built.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
from onnx import TensorProto
import onnxruntime as ort
import optuna
from optuna.trial import TrialState
import pytest

from optuna_quant.measure.evaluate import Top1Accuracy
from optuna_quant.measure.sensitivity import lowest_error
from optuna_quant.measure.sensitivity import measure_scope_errors
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.model_io import load_model
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.trial import records
from optuna_quant.trial.budget import scope_combinations
from optuna_quant.trial.failures import failing_in_measurement
from optuna_quant.trial.space import SearchSpace


class NoInt8Pooling:
    """``agreement``, on a deployment without an int8 GlobalAveragePool: a model that quantizes
    one to an element type of ``refused`` (uint8 or int8 by default) is refused. Counts the models it scores."""

    def __init__(self, agreement: Top1Accuracy, refused: tuple[int, ...] = (TensorProto.UINT8, TensorProto.INT8)) -> None:
        self.agreement = agreement
        self.refused = refused
        self.calls = 0

    def __call__(self, session: ort.InferenceSession) -> float:
        self.calls += 1
        # The session keeps the bytes it was made from: the model's graph, as the deployment sees it.
        graph = onnx.load_from_string(session._model_bytes).graph
        zero_points = {tensor.name: tensor.data_type for tensor in graph.initializer}
        quantized = {node.input[0]: zero_points[node.input[2]] for node in graph.node if node.op_type == "QuantizeLinear"}
        if any(node.op_type == "GlobalAveragePool" and quantized.get(node.output[0]) in self.refused for node in graph.node):
            raise ValueError("this deployment has no int8 GlobalAveragePool")
        return self.agreement(session)


def _measured_with(study: optuna.Study, param: str, choice: str) -> list:
    """The trials that measured ``choice`` (or failed measuring it) rather than being refused at once."""
    return [
        t for t in study.trials
        if t.params.get(param) == choice and "fails on this model" not in t.user_attrs.get("fail_reason", "")
    ]


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["tpe", "gp"])
def test_a_failing_choice_is_measured_once_then_never_drawn(make_study, agreement, sampler) -> None:
    eval_fn = NoInt8Pooling(agreement)
    study = make_study(eval_fn=eval_fn, sampler=sampler, accuracy_loss=50.0)
    study.enqueue_trial({"op_types": "all"})  # the first trial after the reference draws it
    study.optimize(n_trials=16)
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert [t.params["op_types"] for t in failed] == ["all"]
    assert "no int8 GlobalAveragePool" in failed[0].user_attrs["fail_reason"]
    (forbidden,) = records.forbidden_choices(study.study)
    assert (forbidden.param, forbidden.choice, forbidden.trial) == ("op_types", "all", failed[0].number)
    assert "no int8 GlobalAveragePool" in forbidden.reason
    assert [t.number for t in _measured_with(study.study, "op_types", "all")] == [failed[0].number]
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 15

    # Optuna's random sampler reads no prior: its draws of the choice fail at once, unmeasured.
    scored = eval_fn.calls
    again = make_study(
        eval_fn=eval_fn, sampler=optuna.samplers.RandomSampler(seed=3), accuracy_loss=50.0, trials_load_method="warm_start"
    )
    again.optimize(n_trials=40)
    refused = [t for t in again.trials[16:] if t.params["op_types"] == "all"]
    assert refused and all(t.state == TrialState.FAIL for t in refused)
    assert all(t.user_attrs["fail_reason"].startswith("ForbiddenChoiceError: op_types='all' fails on this model (trial") for t in refused)
    assert eval_fn.calls == scored + sum(t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs for t in again.trials[16:])
    assert len(records.forbidden_choices(again.study)) == 1


def _holds(trial: optuna.trial.FrozenTrial, choices: dict) -> bool:
    return all(trial.params.get(name) == choice for name, choice in choices.items())


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["tpe", "gp"])
def test_a_failing_pair_is_measured_once_then_never_drawn(make_study, agreement, sampler) -> None:
    pair = {"activation_mode": "symmetric", "op_types": "all"}
    eval_fn = NoInt8Pooling(agreement, refused=(TensorProto.INT8,))
    study = make_study(eval_fn=eval_fn, sampler=sampler, accuracy_loss=50.0)
    study.enqueue_trial(pair)  # the first trial after the reference draws it
    study.optimize(n_trials=16)
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert len(failed) == 1 and _holds(failed[0], pair)
    (forbidden,) = records.forbidden_choices(study.study)
    assert forbidden.choices == pair and forbidden.trial == failed[0].number
    assert "no int8 GlobalAveragePool" in forbidden.reason
    assert [t for t in study.trials if _holds(t, pair)] == failed
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 15

    # Either choice alone still runs; Optuna's random sampler draws the pair, which fails at once.
    scored = eval_fn.calls
    again = make_study(
        eval_fn=eval_fn, sampler=optuna.samplers.RandomSampler(seed=3), accuracy_loss=50.0, trials_load_method="warm_start"
    )
    again.optimize(n_trials=40)
    later = again.trials[16:]
    refused = [t for t in later if _holds(t, pair)]
    assert refused and all(t.state == TrialState.FAIL for t in refused)
    assert all(
        t.user_attrs["fail_reason"].startswith(f"ForbiddenChoiceError: {forbidden} fails on this model (trial") for t in refused
    )
    for name, choice in pair.items():
        assert any(t.params[name] == choice and t.state == TrialState.COMPLETE for t in later)
    assert all(t.state == TrialState.COMPLETE for t in later if t not in refused)
    assert eval_fn.calls == scored + sum(t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs for t in later)
    assert len(records.forbidden_choices(again.study)) == 1


def test_the_sensitivity_keeps_the_least_set_of_choices_that_fails_wherever_it_meets(cnn, calib) -> None:
    model = load_model(cnn)
    space = SearchSpace.from_model(model, scopes=["mode", "granularity"])
    # The pair of modes fails beside per-channel weights only (the reference's), and runs per tensor.
    failing = {"activation_mode": "symmetric", "weight_mode": "asymmetric", "granularity": "per_channel"}

    def to_config(params: dict) -> QuantConfig:
        config = space.to_config({**space.default_params(), **params})
        # A build that fails where the three meet, and only there: an unknown range estimator.
        return replace(config, range_estimator="histogram") if failing.items() <= params.items() else config

    combinations = scope_combinations(space.distributions())
    errors = measure_scope_errors(model, Quantizer(model, to_feeds(calib, model)), to_feeds(calib, model), combinations, to_config)
    assert [e["params"] for e in errors if e["error"] is None] == [failing]
    (forbidden,) = failing_in_measurement(errors)
    assert forbidden.choices == failing and forbidden.trial is None
    assert forbidden.reason.startswith("ValueError: Unknown range_estimator 'histogram'")
    assert not forbidden.held_by({**failing, "granularity": "per_tensor"})


def test_the_sensitivity_goes_on_around_a_configuration_it_cannot_build(cnn, calib) -> None:
    model = load_model(cnn)
    quantizer = Quantizer(model, to_feeds(calib, model))
    space = SearchSpace.from_model(model, scopes=["range_estimator"])
    combinations = [{"range_estimator": "minmax"}, {"range_estimator": "percentile_99.9"}, {"range_estimator": "histogram"}]
    errors = measure_scope_errors(
        model, quantizer, to_feeds(calib, model), combinations, lambda p: QuantConfig(range_estimator=p["range_estimator"])
    )
    assert [e["error"] is None for e in errors] == [False, False, True]
    assert errors[2]["failure"].startswith("ValueError: Unknown range_estimator 'histogram'")
    assert lowest_error(errors)["params"]["range_estimator"] in {"minmax", "percentile_99.9"}
    (forbidden,) = failing_in_measurement(errors)
    assert (forbidden.param, forbidden.choice, forbidden.trial) == ("range_estimator", "histogram", None)
    assert np.isfinite(errors[0]["error"])
