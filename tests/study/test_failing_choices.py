"""A choice that fails on a model is learnt once: the study stores it, its samplers never draw it
again, and a trial that another sampler gives it fails at once, unmeasured.

The failure is real: an ``eval_fn`` whose deployment has no int8 GlobalAveragePool raises on
every model that quantizes one (Q/DQ on its output), which on the tiny CNN is what
``op_types: all`` (and only it) does. The sensitivity's own failures are real too: a combination whose configuration cannot
be built.
"""

from __future__ import annotations

import numpy as np
import onnx
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
from optuna_quant.trial.failures import failing_alone
from optuna_quant.trial.space import SearchSpace


class NoInt8Pooling:
    """``agreement``, on a deployment without an int8 GlobalAveragePool: a model that quantizes
    one is refused. Counts the models it scores."""

    def __init__(self, agreement: Top1Accuracy) -> None:
        self.agreement = agreement
        self.calls = 0

    def __call__(self, session: ort.InferenceSession) -> float:
        self.calls += 1
        # The session keeps the bytes it was made from: the model's graph, as the deployment sees it.
        graph = onnx.load_from_string(session._model_bytes).graph
        quantized = {node.input[0] for node in graph.node if node.op_type == "QuantizeLinear"}
        if any(node.op_type == "GlobalAveragePool" and node.output[0] in quantized for node in graph.node):
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
    (forbidden,) = failing_alone(space, errors)
    assert (forbidden.param, forbidden.choice, forbidden.trial) == ("range_estimator", "histogram", None)
    assert np.isfinite(errors[0]["error"])
