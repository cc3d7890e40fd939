"""Where a study's time went: the time report adds up what the stored trials measured."""

from __future__ import annotations

import re

import pytest

from optuna_quant.trial import records


def test_the_time_report_adds_up_each_measurement_once_and_ends_at_the_best_trial(make_study) -> None:
    study = make_study(accuracy_loss=5.0, sensitivity="full")
    study.study.enqueue_trial(study.objective.space.default_params())  # a copy of the reference
    study.optimize(n_trials=6)
    trials = study.study.trials
    copies = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert copies and all(t.user_attrs["quantize_s"] > 0 for t in copies)  # copied, not spent
    own = [t for t in trials if "duplicate_of" not in t.user_attrs]
    report = study.time_report()
    assert report.quantize_seconds == pytest.approx(sum(t.user_attrs["quantize_s"] for t in own))
    assert report.evaluate_seconds == pytest.approx(sum(t.user_attrs["eval_s"] for t in own))
    assert report.timing_seconds == pytest.approx(sum(t.user_attrs["latency_s"] for t in own))
    assert report.sensitivity_seconds == records.sensitivity_seconds(study.study) > 0
    best = study.best_result
    assert report.best_number == best.number
    start = min(t.datetime_start for t in trials)
    assert report.to_best_seconds == pytest.approx((trials[best.number].datetime_complete - start).total_seconds())
    assert 0 < report.to_best_seconds <= report.wall_seconds
    assert report.other_seconds >= 0
    pattern = r"Best model \(trial \d+\) after [\d.]+ s of [\d.]+ s: quantize [\d.]+ s, evaluate [\d.]+ s, time [\d.]+ s, sensitivity [\d.]+ s, other [\d.]+ s(; \d+ of \d+ trials pruned)?"
    assert re.fullmatch(pattern, report.summary())
    assert report.pruned == sum(t.state.name == "PRUNED" and records.measured(t) for t in trials)
