"""End-to-end runs on a real small model, real onnxruntime sessions and a real SQLite storage."""

from __future__ import annotations

import dataclasses
import logging
import os

from conftest import assert_int8_layers
import numpy as np
import onnx
import onnxruntime as ort
import optuna
from optuna.trial import TrialState
import pytest

from examples.tiny_cnn import build_cnn
import optuna_quant as oq
from optuna_quant.measure.cpu import int8_support
from optuna_quant.measure.latency import RETIMES
from optuna_quant.samplers import TPESampler
from optuna_quant.trial import guidance
from optuna_quant.trial import records
from optuna_quant.trial.records import FP32_ACCURACY_KEY
from optuna_quant.trial.records import SCALING_KEY
from optuna_quant.trial.records import stored_sensitivity
from optuna_quant.trial.records import WORKER
from optuna_quant.trial.records import WORKER_KEY
from optuna_quant.trial.space import LAYER_PREFIX
from optuna_quant.trial.stopping import meets_targets
from optuna_quant.trial.stopping import target_reached


def test_run_records_everything(make_study, caplog) -> None:
    caplog.set_level(logging.INFO, logger="optuna_quant")
    study = make_study(accuracy_loss=5.0, latency_reduce=1.0)
    best = study.optimize(n_trials=5)
    trials = study.trials
    assert len(trials) == 5
    assert trials[0].user_attrs["reference"] is True
    assert trials[0].params == study.objective.space.default_params()
    assert study.user_attrs[FP32_ACCURACY_KEY] == 1.0
    assert set(study.user_attrs[SCALING_KEY]) == {"acc_min", "acc_max", "acc_scale", "lat_min", "lat_max", "lat_scale"}
    for trial in trials:
        assert trial.state == TrialState.COMPLETE
        attrs = trial.user_attrs
        for key in ("acc_loss", "lat_diff", "accuracy", "fp32_latency_ms", "int8_latency_ms", "lat_diff_spread"):
            assert key in attrs
        assert attrs["acc_loss"] == pytest.approx(1.0 - attrs["accuracy"])
        assert trial.constraints["accuracy"] == pytest.approx(attrs["acc_loss"] - 0.05)
        # A model with every layer in fp32 is the fp32 model: it meets no latency target.
        assert trial.constraints["latency"] == pytest.approx(1.0 - (attrs["lat_diff"] if attrs["quantized"] else 0.0))
    assert best is not None and best.number in {t.number for t in trials}
    # POT's rule: the fastest trial within the accuracy target, the lower acc_loss among ties.
    met = [t for t in trials if t.user_attrs["acc_loss"] <= 0.05]
    assert met
    assert best.number == max(met, key=lambda t: (t.user_attrs["lat_diff"], -t.user_attrs["acc_loss"])).number
    messages = [r.getMessage() for r in caplog.records]
    # Optuna's trial numbers: trial 0 is the reference, trials 1 to 4 the iterations.
    starts = [m for m in messages if m.startswith("Trial iteration start: ")]
    assert starts == [f"Trial iteration start: {n} / 5" for n in range(1, 5)]
    assert any(m.startswith("Trial iteration end: 4 / 5 acc_loss: ") for m in messages)
    assert any(
        m.startswith("Current iteration acc_loss: ") and m.endswith(" min") and "exec_time: " in m for m in messages
    )
    before = next(i for i, m in enumerate(messages) if m.startswith("Reference (default configuration): measuring"))
    # Between the two: the one-off calibration's own lines (and a re-timing, if the timing was noisy).
    after = next(m for m in messages[before + 1 :] if m.startswith("Reference (default configuration) "))
    assert after.startswith("Reference (default configuration) acc_loss: ") and after.endswith(" s)"), after


def test_duplicate_params_return_the_stored_result(make_study, caplog) -> None:
    caplog.set_level(logging.INFO, logger="optuna_quant")
    study = make_study()
    params = {**study.objective.space.default_params(), "layer:fc": "fp32", "activation_mode": "symmetric"}
    study.enqueue_trial(params)
    study.enqueue_trial(params)
    study.optimize(n_trials=3)
    # Enqueued trials take the first numbers; the reference comes after them.
    first, second = study.trials[0], study.trials[1]
    assert second.user_attrs["duplicate_of"] == first.number
    assert second.value == first.value
    assert second.user_attrs["lat_diff"] == first.user_attrs["lat_diff"]
    assert "Params already evaluated. Returning previous result: acc_loss:" in caplog.text


def test_a_repeat_of_the_reference_is_no_second_reference(make_study) -> None:
    study = make_study()
    study.enqueue_trial(study.objective.space.default_params())
    study.optimize(n_trials=2)
    references = [t for t in study.trials if t.user_attrs.get("reference")]
    assert len(references) == 1
    repeat = next(t for t in study.trials if "duplicate_of" in t.user_attrs)
    assert repeat.user_attrs["duplicate_of"] == references[0].number
    assert repeat.user_attrs[WORKER_KEY] == WORKER and "reference" not in repeat.user_attrs
    assert repeat.user_attrs["lat_diff"] == references[0].user_attrs["lat_diff"]
    assert repeat.constraints == references[0].constraints


def test_stop_on_target_stops_at_first_trial_meeting_both(make_study) -> None:
    study = make_study(accuracy_loss=50.0, latency_reduce=0.05, stop_on_target=True)
    study.optimize(n_trials=20)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 2  # the reference, then the first optimised trial meets both
    assert target_reached(study.trials, study.targets) == 1
    assert study.best_result.targets_met


def test_a_configuration_that_quantizes_nothing_is_the_fp32_model_and_meets_no_target(make_study) -> None:
    """Every layer in fp32 builds the fp32 model, whose lat_diff reads about 1: it would meet any
    latency target up to 1 by timing noise, and the study would stop on a model with no int8."""
    study = make_study(accuracy_loss=50.0, latency_reduce=0.05, stop_on_target=True)
    space = study.objective.space
    layers = [name for name in space.distributions() if name.startswith(LAYER_PREFIX)]
    fp32_model = {**space.default_params(), **dict.fromkeys(layers, "fp32")}
    study.enqueue_trial(fp32_model)  # enqueued trials come first, the reference after them
    study.optimize(n_trials=5)
    finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
    fp32_trial = finished[0]
    assert fp32_trial.params == fp32_model and fp32_trial.user_attrs["quantized"] is False
    assert fp32_trial.user_attrs["acc_loss"] <= 0.5 and fp32_trial.user_attrs["lat_diff"] >= 0.05  # "within" both
    assert not meets_targets(fp32_trial, study.targets)
    assert fp32_trial.constraints["latency"] > 0  # infeasible to a sampler that reads constraints
    # The reference (which quantizes everything) is the baseline; the next trial meets both.
    assert len(finished) == 3 and finished[2].user_attrs["quantized"] is True
    assert target_reached(study.trials, study.targets) == finished[2].number
    assert study.best_result.number != fp32_trial.number and study.best_result.targets_met


def test_stop_on_target_is_decided_from_the_trials_of_every_worker(make_study) -> None:
    # A speed-up of 50 is out of reach: no trial of this worker meets it.
    study = make_study(latency_reduce=50.0, stop_on_target=True)
    study.optimize(n_trials=3)
    assert len(study.trials) == 3 and target_reached(study.trials, study.targets) is None
    # Another worker's trial met both targets: this worker runs no further trial.
    met = study.trials[1]
    study.add_trial(
        optuna.trial.create_trial(
            params=met.params,
            distributions=met.distributions,
            value=0.0,
            user_attrs={**met.user_attrs, "lat_diff": 60.0},
        )
    )
    study.optimize(n_trials=8)
    assert len(study.trials) == 4
    assert target_reached(study.trials, study.targets) == 3


def test_failing_trial_is_recorded_and_the_study_goes_on(make_study, agreement) -> None:
    calls = {"n": 0}

    def flaky(session: ort.InferenceSession) -> float:
        calls["n"] += 1
        if calls["n"] == 3:  # fp32 baseline, reference, then the first optimised trial
            raise OSError("dataset shard unreadable")
        return agreement(session)

    study = make_study(eval_fn=flaky)
    study.optimize(n_trials=4)
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert "dataset shard unreadable" in study.trials[1].user_attrs["fail_reason"]


def test_export_best_and_missed_target(tmp_path, make_study, caplog) -> None:
    # A speed-up of 50 is out of reach: the run still exports its best and says what it missed.
    study = make_study(accuracy_loss=50.0, latency_reduce=50.0)
    best = study.optimize(n_trials=3)
    assert best.missed == ("latency",)
    assert "accuracy met but not latency" in best.summary()
    out = tmp_path / "out" / "best.int8.onnx"
    study.export_best(out)
    # conv1, conv2 and fc are all in it; int8 weights come from a DequantizeLinear, fp32 ones do not.
    exported = onnx.load(str(out))
    assert_int8_layers(exported, best.params)
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert "misses the latency target" in caplog.text
    # The model says what it measured, and on which CPU int8 class: its figures hold there only.
    props = {prop.key: prop.value for prop in exported.metadata_props}
    assert props["optuna_quant.study_trial"] == str(best.number)
    assert float(props["optuna_quant.lat_diff"]) == best.lat_diff and float(props["optuna_quant.acc_loss"]) == best.acc_loss
    assert props["optuna_quant.int8_class"] == int8_support().int8_class == study.user_attrs["int8_class"]
    assert props["optuna_quant.onnxruntime"] == ort.__version__


def test_warm_start_continues_to_total_and_cold_start_deletes(make_study) -> None:
    first = make_study()
    first.optimize(n_trials=3)
    kept = [(t.number, t.params) for t in first.trials]
    warm = make_study(trials_load_method="warm_start")
    warm.optimize(n_trials=5)
    assert len(warm.trials) == 5
    assert [(t.number, t.params) for t in warm.trials[:3]] == kept
    assert sum(1 for t in warm.trials if t.user_attrs.get("reference")) == 1
    cold = make_study(trials_load_method="cold_start")
    assert cold.trials == []


class _CtrlCInAsk(optuna.samplers.RandomSampler):
    """Ctrl-C while Optuna asks for trial ``number``: the trial is RUNNING, the objective not started.

    With ``failing_clean_up``, a clean-up replaces the ``KeyboardInterrupt`` with its own error, as
    Optuna's journal lock does when the Ctrl-C comes inside its release.
    """

    def __init__(self, number: int, failing_clean_up: bool) -> None:
        super().__init__(seed=0)
        self.number: int | None = number
        self.failing_clean_up = failing_clean_up

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.number != self.number:
            return
        self.number = None
        try:
            raise KeyboardInterrupt
        finally:
            if self.failing_clean_up:
                os.unlink("no-such-lock-file")


@pytest.mark.parametrize("failing_clean_up", [False, True])
def test_ctrl_c_while_optuna_asks_fails_the_trial_and_queues_it_again(make_study, failing_clean_up: bool) -> None:
    # Before, the trial stayed RUNNING with no heartbeat: nothing failed it, and a warm start
    # waited on it for ever once the budget was used. The clean-up's error once failed the trial
    # for good, as if its configuration had failed.
    interrupted = make_study(sampler=_CtrlCInAsk(2, failing_clean_up))
    with pytest.raises(KeyboardInterrupt):
        interrupted.optimize(n_trials=4)
    states = [t.state for t in interrupted.trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    warm = make_study(trials_load_method="warm_start")
    warm.optimize(n_trials=4)
    states = [t.state for t in warm.trials]
    assert states.count(TrialState.COMPLETE) == 4 and TrialState.RUNNING not in states


def test_warm_start_refuses_another_model(make_study) -> None:
    first = make_study()
    first.optimize(n_trials=1)
    with pytest.raises(ValueError, match="another model sha256"):
        make_study(model=build_cnn(seed=5), trials_load_method="warm_start")
    assert len(first.trials) == 1  # refused by create_study, before anything was stored


def test_fine_tune_and_eval(make_study) -> None:
    base = make_study(accuracy_loss=50.0)
    best = base.optimize(n_trials=4)
    fine = make_study(accuracy_loss=50.0, trials_load_method="fine_tune", scopes=["range_estimator"])
    assert fine.study.study_name == "optuna-quant-fine_tune"
    # A worker joining the fine-tune study, even before its first trial, runs on its narrowed space.
    joined = make_study(
        accuracy_loss=50.0, study_name="optuna-quant-fine_tune", trials_load_method="warm_start",
        scopes=["range_estimator"],
    )
    assert joined.objective.space == fine.objective.space
    with pytest.raises(ValueError, match=r"another search space: parameter\(s\) \['activation_mode', 'weight_mode'\] differ"):
        make_study(
            accuracy_loss=50.0, study_name="optuna-quant-fine_tune", trials_load_method="warm_start",
            scopes=["range_estimator", "mode"],
        )
    fine.optimize(n_trials=3)
    for trial in fine.trials:
        assert set(trial.params) == {"range_estimator"}
    base_config = base.objective.space.to_config(best.params)
    assert fine.objective.space.base == base_config
    evaluated = make_study(accuracy_loss=50.0, trials_load_method="eval")
    n_before = len(evaluated.trials)
    result = evaluated.optimize(n_trials=10)
    assert len(evaluated.trials) == n_before
    assert result.number == best.number


def test_metrics_skip_fp32_evaluation_and_subset(make_study, agreement) -> None:
    seen = []

    def counting(session, subset_size=None):
        seen.append(subset_size)
        return agreement(session, subset_size=subset_size)

    study = make_study(eval_fn=counting, metrics=1.0, eval_subset_size=50)
    study.optimize(n_trials=2)
    assert seen == [50, 50]  # the reference and one trial; no fp32 evaluation


def test_objective_on_a_plain_optuna_study(cnn_path, calib, agreement, fast_bench) -> None:
    objective = oq.QuantizationObjective(cnn_path, calib, agreement, benchmark=fast_bench)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(objective, n_trials=2)
    assert len(study.trials) == 3  # the reference was recorded beside the two trials
    assert sum(1 for t in study.trials if t.user_attrs.get("reference")) == 1


def test_measure_model_measures_a_ready_model_as_measure_does(cnn, calib, fast_bench) -> None:
    inputs = np.concatenate(calib)

    def mean_abs_logit(session):
        # Continuous, so int8 rounding moves it: top-1 agreement would give acc_loss 0 for both.
        return float(np.abs(session.run(None, {"input": inputs})[0]).mean())

    objective = oq.QuantizationObjective(cnn, calib, mean_abs_logit, benchmark=fast_bench)
    params = objective.space.default_params()
    int8_model = objective.measurer.quantizer.quantize(objective.space.to_config(params))
    measured = objective.measure(params)
    assert measured.acc_loss != 0
    assert objective.measure_model(int8_model).acc_loss == measured.acc_loss
    # The relative loss against the fp32 score, computed here from a plain session.
    fp32 = mean_abs_logit(ort.InferenceSession(cnn.SerializeToString(), providers=["CPUExecutionProvider"]))
    assert measured.acc_loss == pytest.approx((fp32 - measured.accuracy) / fp32)


def test_eval_of_a_study_made_outside_optuna_quant_is_refused(tmp_path, make_study) -> None:
    optuna.create_study(study_name="plain", storage=f"sqlite:///{tmp_path}/study.db")
    with pytest.raises(ValueError, match=r"Study 'plain' holds no optuna-quant search space"):
        make_study(study_name="plain", trials_load_method="eval")


def test_a_latency_batch_larger_than_the_calibration_data_is_refused(make_study, fast_bench) -> None:
    # conftest's calibration data hold 16 samples.
    with pytest.raises(ValueError, match=r"benchmark.batch_size: A batch of 17 samples was asked for, but the data hold 16"):
        make_study(benchmark=dataclasses.replace(fast_bench, batch_size=17))
    assert make_study(benchmark=dataclasses.replace(fast_bench, batch_size=16)).objective.measurer.latency_feed["input"].shape[0] == 16


def test_progress_bar_shows_trial_k_of_n_the_best_and_the_time_left(make_study, capsys) -> None:
    study = make_study(accuracy_loss=50.0)
    best = study.optimize(n_trials=3, timeout=600, show_progress_bar=True)
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
    last = [line for line in bar if "3/3" in line][-1]
    assert f"acc_loss={best.acc_loss:.4f}" in last and f"lat_diff={best.lat_diff:.4f}" in last
    assert "time left=" in last and " min" in last


def test_a_noisy_timing_is_timed_again(cnn_path, calib, agreement, fast_bench, caplog) -> None:
    # A contention threshold of a billionth flags every block and no block is re-timed: every
    # timing is noisy, so each measurement is timed RETIMES times more, and says so.
    always_noisy = dataclasses.replace(fast_bench, contention=1e-9, retimes=0)
    objective = oq.QuantizationObjective(cnn_path, calib, agreement, benchmark=always_noisy)
    with caplog.at_level(logging.INFO, logger="optuna_quant"):
        measured = objective.measure(objective.space.default_params())
    noisy = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Timing noisy")]
    assert len(noisy) == RETIMES and all("contended" in line for line in noisy)
    assert [line.rsplit("(", 1)[1] for line in noisy] == [f"{k} / {RETIMES})." for k in range(1, RETIMES + 1)]
    assert measured.latency.contended and measured.lat_diff > 0


def test_pareto_mode_returns_both_metrics_and_keeps_pots_best(tmp_path, make_study) -> None:
    study = make_study(
        accuracy_loss=50.0, latency_reduce=0.1, objective_mode="pareto", artifact_dir=tmp_path / "models",
    )
    best = study.optimize(n_trials=4)
    assert [d.name for d in study.study.directions] == ["MINIMIZE", "MAXIMIZE"]
    assert study.study.metric_names == ["acc_loss", "lat_diff"]
    for trial in study.trials:
        assert trial.values == [trial.user_attrs["acc_loss"], trial.user_attrs["lat_diff"]]
    assert best.lat_diff == max(t.user_attrs["lat_diff"] for t in study.trials)  # all within accuracy
    # Optuna's front holds feasible trials only: with targets every trial meets, it cannot be empty.
    # No trial dominates POT's best: the highest lat_diff, the lowest acc_loss among ties.
    assert best.number in {t.number for t in study.study.best_trials}
    assert (tmp_path / "models").is_dir()
    with pytest.raises(ValueError, match="'loss' mode"):
        make_study(trials_load_method="warm_start")


def test_a_transformer_study_by_layer_groups_searches_and_measures_the_groups(
    tmp_path, bert_path, bert_feeds, bert_agreement
) -> None:
    study = oq.create_study(
        str(bert_path), bert_feeds, bert_agreement, layer_groups="block", sampler="tpe", seed=0,
        storage=f"sqlite:///{tmp_path}/study.db", study_name="bert-blocks",
        benchmark={"warmup": 2, "blocks": 3, "min_seconds": 0.03}, sensitivity="full",
    )
    study.optimize(n_trials=4)
    layers = {name for name in study.objective.space.distributions() if name.startswith("layer:")}
    assert layers == {"layer:block.0", "layer:block.1"}
    assert all(trial.state == TrialState.COMPLETE for trial in study.trials)
    assert all(layers <= trial.params.keys() for trial in study.trials)
    # The sensitivity measured each group as one layer, and its prior is over the groups.
    assert set(stored_sensitivity(study.study)) == {"block.0", "block.1"}
    assert records.stored_space(study.study).units() == study.objective.space.units()


def test_a_worker_with_other_layer_groups_is_refused_naming_them(tmp_path, bert_path, bert_feeds, bert_agreement) -> None:
    kwargs = dict(storage=f"sqlite:///{tmp_path}/study.db", study_name="bert", benchmark={"warmup": 1, "blocks": 2, "min_seconds": 0.02})
    oq.create_study(str(bert_path), bert_feeds, bert_agreement, layer_groups="role", **kwargs)
    with pytest.raises(ValueError, match=r"another search space: parameter\(s\) .*'layer:block.0'.*layer_groups"):
        oq.create_study(str(bert_path), bert_feeds, bert_agreement, layer_groups="block", trials_load_method="warm_start", **kwargs)


class _OneStartupTrial(TPESampler):
    max_startup_trials = 1


@pytest.mark.parametrize("sampler, queued", [("tpe", [1, 2]), ("gp", []), (_OneStartupTrial, [1])])
def test_start_up_trials_are_queued_for_the_tpe_and_not_for_the_gp(make_study, sampler, queued) -> None:
    # The GP's acquisition, weighted by the prior, tries the start-up trials' configurations
    # itself: queued before it, they cost trials (docs/benchmarks.md, "The start-up queue").
    # A sampler's max_startup_trials caps the queue.
    sampler = sampler if isinstance(sampler, str) else sampler(seed=0)
    # Every layer measured, and no recipe before the start-up trials.
    study = make_study(sampler=sampler, latency_reduce=100.0, sensitivity="full", recipes=False)  # never met
    study.optimize(n_trials=9)  # room for two start-up trials, one per four after the reference
    trials = study.study.trials
    assert records.is_reference(trials[0]) and len(trials) == 9
    assert [t.number for t in trials[1:] if "fixed_params" in t.system_attrs] == queued
    # The GP would get the first alone where the prior predicts it misses the accuracy target
    # (tests/trial/test_prior_for_space.py); on this model it predicts a hit.
    assert not guidance.stored(study.study).predicts_base_misses(study.targets)
