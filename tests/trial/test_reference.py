"""The reference trial: an eval_fn that fails on it is one clear error, and a fixed run goes on."""

from __future__ import annotations

from optuna.trial import TrialState
import pytest

from optuna_quant.trial.records import SCALING_KEY
from optuna_quant.trial.reference import ReferenceMeasurementError


def test_eval_fn_raising_on_the_reference_is_one_clear_error(make_study, agreement) -> None:
    def broken(session):
        raise KeyError("labels")

    study = make_study(eval_fn=broken)
    with pytest.raises(ReferenceMeasurementError) as err:
        study.optimize(n_trials=3)
    message = str(err.value)
    assert "\n" not in message and "eval_fn" in message and "reference" in message and "labels" in message
    assert study.trials == []  # the fp32 model is scored before any trial
    calls = []

    def int8_broken(session):  # scores the fp32 model, then raises on the int8 reference
        calls.append(session)
        if len(calls) > 1:
            raise KeyError("labels")
        return agreement(session)

    study = make_study(eval_fn=int8_broken)
    with pytest.raises(ReferenceMeasurementError, match=r"eval_fn could not score the reference.*int8.*labels"):
        study.optimize(n_trials=3)
    (trial,) = study.trials  # nothing ran after the reference
    assert trial.state == TrialState.FAIL and "labels" in trial.user_attrs["fail_reason"]
    # Fixed, the next run measures the reference again and goes on; the failed one counts.
    fixed = make_study(trials_load_method="warm_start")
    fixed.optimize(n_trials=3)
    assert [t.state for t in fixed.trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert fixed.trials[1].user_attrs["reference"] is True and SCALING_KEY in fixed.user_attrs
