"""The pruning: the latency pruner's bar read from a real study's records, the objective's pruned
trials, and an evaluation by samples stopped once confidently over the accuracy target."""

from __future__ import annotations

from collections.abc import Iterator
import dataclasses

import numpy as np
import onnxruntime as ort
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial
from optuna.trial import TrialState
import pytest

import optuna_quant as oq
from optuna_quant.measure.evaluate import Top1Accuracy
from optuna_quant.measure.loss import LossScaling
from optuna_quant.measure.loss import Targets
from optuna_quant.measure.loss import weighted_loss
from optuna_quant.measure.measurer import Measurer
from optuna_quant.pruners import LatencyPruner
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.trial import records
from optuna_quant.trial.space import SearchSpace
from optuna_quant.trial.timing import time_report


TARGETS = Targets(accuracy_loss=1.0)
SCALING = LossScaling.from_reference(acc_loss=0.002, lat_diff=1.5, targets=TARGETS)


def _study_with(*results: tuple[float, float]) -> optuna.Study:
    """A study as create_study stores it (targets, scaling), holding one completed trial per ``(acc_loss, lat_diff)``."""
    study = optuna.create_study(pruner=LatencyPruner())
    space = SearchSpace(nodes=("conv",), scopes=frozenset({"layer"}))
    records.share_records(study, space=space, fingerprint="f", targets=TARGETS, int8_class="x86-vnni")
    records.store_reference(study, 0.9, 1.0, SCALING)
    for acc_loss, lat_diff in results:
        loss = weighted_loss(acc_loss, lat_diff, TARGETS, SCALING)
        study.add_trial(
            create_trial(
                params={"x": "a"},
                distributions={"x": CategoricalDistribution(["a"])},
                value=loss,
                user_attrs={"acc_loss": acc_loss, "lat_diff": lat_diff, "loss": loss},
            )
        )
    return study


def _reported(study: optuna.Study, acc_loss: float, ratios: list[float]) -> bool:
    trial = study.ask()
    for step, ratio in enumerate(ratios):
        trial.report(weighted_loss(acc_loss, ratio, TARGETS, SCALING), step)
    return trial.should_prune()


def test_blocks_all_slower_than_the_best_within_target_are_pruned_after_the_warmup() -> None:
    study = _study_with((0.005, 2.0), (0.03, 3.0))  # the faster one misses the accuracy target: no bar
    assert _reported(study, 0.0, [1.5, 1.6]) is False  # two blocks: still in the warmup
    assert _reported(study, 0.0, [1.5, 1.6, 1.9]) is True
    # One block within the margin (2 % below 2.0) is enough to go on.
    assert _reported(study, 0.0, [1.5, 1.6, 1.97]) is False
    # Over the accuracy target, POT's penalty puts every block above the bar, however fast.
    assert _reported(study, 0.05, [2.5, 2.5, 2.5]) is True


def test_nothing_is_pruned_without_a_model_within_target() -> None:
    assert _reported(_study_with((0.03, 3.0)), 0.05, [0.5, 0.5, 0.5]) is False
    plain = optuna.create_study(pruner=LatencyPruner())  # not made by create_study: no targets stored
    plain.add_trial(create_trial(params={}, distributions={}, value=1.0, user_attrs={"acc_loss": 0.0, "lat_diff": 2.0}))
    trial = plain.ask()
    for step in range(3):
        trial.report(1e9, step)
    assert trial.should_prune() is False


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n_warmup_steps": 0}, "n_warmup_steps"), ({"n_warmup_steps": 2.5}, "n_warmup_steps"), ({"margin": 1.0}, "margin")],
)
def test_bad_settings_name_the_setting(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        LatencyPruner(**kwargs)


def test_a_pruned_trial_keeps_what_it_measured_and_its_copy_is_pruned_too(cnn_path, calib, agreement, fast_bench) -> None:
    objective = oq.QuantizationObjective(
        str(cnn_path), calib, agreement, benchmark=dataclasses.replace(fast_bench, blocks=5), prune=True
    )
    # Optuna's own pruner: every block's loss is above -1e9, so the first block prunes.
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=-1e9))
    params = {**objective.space.default_params(), "layer:fc": "fp32"}  # not the reference, which is not pruned
    study.enqueue_trial(params)
    study.enqueue_trial(params)
    study.optimize(objective, n_trials=2)
    pruned, copy, reference = study.trials  # the reference is recorded as a trial of its own
    assert records.is_reference(reference)
    assert reference.state == TrialState.COMPLETE and not reference.intermediate_values
    assert pruned.state == TrialState.PRUNED and pruned.user_attrs["lat_blocks"] == 1
    assert records.acc_loss(pruned) == records.acc_loss(reference)
    assert pruned.value == pytest.approx(records.loss(pruned)) == pruned.intermediate_values[1]
    assert "timing blocks" in pruned.user_attrs["pruned"]
    assert copy.state == TrialState.PRUNED and copy.user_attrs["duplicate_of"] == pruned.number
    assert copy.value == pruned.value and "lat_blocks" in copy.user_attrs
    report = time_report(study.trials, reference, 0.0)
    assert (report.pruned, report.trials) == (2, 3) and report.summary().endswith("; 2 of 3 trials pruned")


def test_pruning_needs_the_loss_mode(cnn_path, calib, agreement) -> None:
    with pytest.raises(ValueError, match="prune needs objective_mode 'loss'"):
        oq.QuantizationObjective(str(cnn_path), calib, agreement, objective_mode="pareto", prune=True)


def test_create_study_prunes_by_default_and_not_when_told(make_study) -> None:
    assert isinstance(make_study().study.pruner, LatencyPruner)
    assert isinstance(make_study(pruning=False).study.pruner, optuna.pruners.NopPruner)
    study = make_study(pruning=False)
    study.optimize(n_trials=3)
    assert all(not t.intermediate_values for t in study.trials)
    assert isinstance(make_study(objective_mode="pareto").study.pruner, optuna.pruners.NopPruner)


class ExactAgreement:
    """A real evaluation by samples: 1 where a sample's outputs equal fp32's to 1e-6, else 0.

    Any int8 model misses on every sample; the fp32 model scores 1.
    """

    def __init__(self, model_path: str, inputs: np.ndarray, batch_size: int = 100) -> None:
        session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
        self.inputs, self.batch_size = inputs, batch_size
        self.expected = session.run(None, {session.get_inputs()[0].name: inputs})[0]

    def sample_scores(self, session: ort.InferenceSession, subset_size: int | None = None) -> Iterator[np.ndarray]:
        name = session.get_inputs()[0].name
        for start in range(0, len(self.inputs), self.batch_size):
            got = session.run(None, {name: self.inputs[start : start + self.batch_size]})[0]
            gap = np.abs(got - self.expected[start : start + self.batch_size]).reshape(len(got), -1).max(axis=1)
            yield (gap <= 1e-6).astype(np.float64)

    def __call__(self, session: ort.InferenceSession, subset_size: int | None = None) -> float:
        return float(np.mean(np.concatenate(list(self.sample_scores(session)))))


def test_an_evaluation_confidently_over_target_stops_once_a_model_within_it_exists(cnn_path, calib, agreement, fast_bench) -> None:
    evaluate = ExactAgreement(str(cnn_path), agreement.inputs)  # 200 samples, two batches
    objective = oq.QuantizationObjective(str(cnn_path), calib, evaluate, benchmark=fast_bench, prune=True)
    study = optuna.create_study()
    params = {**objective.space.default_params(), "layer:fc": "fp32"}
    study.enqueue_trial(params)
    study.optimize(objective, n_trials=1)  # no model within target yet: the whole evaluation
    measured = study.trials[0]
    assert measured.state == TrialState.COMPLETE and records.acc_loss(measured) == 1.0
    assert "eval_samples" not in measured.user_attrs
    # Another worker's model within target, then the same configuration built another way.
    distributions = objective.space.distributions()
    study.add_trial(
        create_trial(
            params=objective.space.default_params(), distributions=distributions, value=-10.0,
            user_attrs={"acc_loss": 0.0, "lat_diff": 2.0, "quantized": True, "loss": -10.0},
        )
    )
    study.enqueue_trial({**params, "layer:conv1": "fp32"})
    study.optimize(objective, n_trials=1)
    pruned = study.trials[-1]
    assert pruned.state == TrialState.PRUNED and pruned.user_attrs["eval_samples"] == 100
    assert records.acc_loss(pruned) == 1.0  # every sample of the first batch lost: the estimate
    assert pruned.user_attrs["pruned"].startswith("over the accuracy target on its first 100 samples")


def test_an_evaluation_by_samples_estimates_the_score_where_it_stopped(cnn_path, calib, agreement, fast_bench) -> None:
    agreement_by_hundreds = Top1Accuracy(agreement.inputs, agreement.labels, batch_size=100)
    measurer = Measurer(str(cnn_path), calib, agreement_by_hundreds, benchmark=fast_bench)
    config = QuantConfig()
    bounds: list[float] = []
    stopped = measurer.measure(config, accuracy_watch=lambda bound: bounds.append(bound) or True)
    assert stopped.eval_samples == 100 and len(bounds) == 1  # stopped at the first of two batches
    int8 = ort.InferenceSession(measurer.build(config).SerializeToString(), providers=["CPUExecutionProvider"])
    first = next(agreement_by_hundreds.sample_scores(int8))
    assert stopped.acc_loss == pytest.approx(1.0 - float(np.mean(first)))  # fp32 agrees with itself: 1
    whole = measurer.measure(config, accuracy_watch=lambda bound: False)
    assert whole.eval_samples is None and whole.accuracy == pytest.approx(agreement(int8))


def test_an_evaluation_that_scores_other_samples_each_call_is_refused_naming_the_counts(cnn_path, calib, agreement, fast_bench) -> None:
    class Shrinking(Top1Accuracy):  # scores one batch fewer on every call: 2 (the baseline), 1 (fp32), 0
        calls = 0

        def sample_scores(self, session, subset_size=None):
            Shrinking.calls += 1
            yield from list(super().sample_scores(session))[: 3 - Shrinking.calls]

    measurer = Measurer(str(cnn_path), calib, Shrinking(agreement.inputs, agreement.labels, batch_size=100), benchmark=fast_bench)
    with pytest.raises(ValueError, match="scored 0 samples of the int8 model and 100 of the fp32 model"):
        measurer.measure(QuantConfig(), accuracy_watch=lambda bound: False)
