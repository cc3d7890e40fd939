"""The pruning benchmark's reading of its runs: wrong prunes and stops, the bar a prune was judged by, the time saved."""

from __future__ import annotations

from datetime import datetime
from datetime import timedelta

from optuna.trial import create_trial
from optuna.trial import TrialState
import pytest

from benchmarks.real_models.pruning import bar_then
from benchmarks.real_models.pruning import format_summary
from benchmarks.real_models.pruning import summarise
from benchmarks.real_models.pruning import wrong_prunes
from optuna_quant.measure.loss import Targets


def _check(wrong: bool, saved: float, eval_samples: int | None = None, eval_wrong: bool = False) -> dict:
    check = {"number": 7, "wrong": wrong, "ahead_of_bar": wrong, "seconds_saved": saved, "eval_samples": eval_samples, "eval_wrong": eval_wrong}
    if wrong:  # a near tie, re-timed beside the best
        check.update(pruned_lat_diff=2.437, full_lat_diff=2.517, best_lat_diff=2.558, side_by_side={"pruned": 2.48, "best": 2.475})
    return check


def test_the_summary_counts_wrong_prunes_and_the_median_share_of_timing_saved() -> None:
    runs = [
        {"seed": 0, "wall_s": 100.0, "trials": 20, "measured": 18, "checks": [_check(False, 4.0), _check(True, 6.0)]},
        {"seed": 1, "wall_s": 50.0, "trials": 20, "measured": 17, "checks": [_check(False, 1.0, 250), _check(False, 0.0, 500, True)]},
        {"seed": 2, "error": "RuntimeError: out of memory"},
    ]
    row = summarise({"model": "m", "int8_class": "x86-amx", "runs": runs})
    assert (row["seeds"], row["trials"], row["measured"], row["pruned"], row["wrong"]) == (2, 40, 35, 4, 1)
    assert (row["eval_stopped"], row["eval_wrong"]) == (2, 1)
    assert row["saved_share"] == pytest.approx((10 / 110 + 1 / 51) / 2)  # of each study's time unpruned
    assert row["retimed"] == 1
    assert "| m (x86-amx) | 35 | 4 | 1 | 1 | 1 | 2 (1) | 5.5 s (6 %) |" in format_summary([row])
    report = {"model": "m", "int8_class": "x86-amx", "runs": runs}
    assert wrong_prunes(report) == [
        "m seed 0 trial 7: pruned at 2.437, in full 2.517; beside the best over the rounds 2.480 against 2.475"
        " (the best's recorded reading 2.558)"
    ]


def test_a_prune_is_judged_by_the_best_within_target_finished_before_it() -> None:
    start = datetime(2026, 1, 1)

    def trial(minute: int, acc_loss: float, lat_diff: float, state: TrialState = TrialState.COMPLETE):
        return create_trial(
            state=state,
            value=0.0,
            user_attrs={"acc_loss": acc_loss, "lat_diff": lat_diff, "loss": 0.0},
            params={},
            distributions={},
        ), start + timedelta(minutes=minute)

    made = [trial(1, 0.0, 1.5), trial(2, 0.05, 3.0), trial(4, 0.0, 2.0), trial(3, 0.0, 0.9, TrialState.PRUNED)]
    trials = []
    for frozen, end in made:
        frozen.datetime_start, frozen.datetime_complete = start, end
        trials.append(frozen)
    pruned = trials[3]
    # Finished before it: 1.5 within target and 3.0 over it; 2.0 finished after it.
    assert bar_then(trials, pruned, Targets(accuracy_loss=1.0)) == 1.5
