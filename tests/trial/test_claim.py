"""No configuration measured twice: the first trial to claim a configuration under the study lock
measures it, and the others wait for it, then copy its result, whatever their numbers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant._optuna_private import study_identity
from optuna_quant._optuna_private import trial_id
from optuna_quant.trial import records
from optuna_quant.trial.claim import claim


MEASURED = {"acc_loss": 0.004, "lat_diff": 1.8, "accuracy": 0.97}


def test_a_trial_popped_after_another_claimed_its_configuration_copies_it(make_study) -> None:
    # The earlier rule, "the lowest-numbered running trial measures", measured this one twice: a
    # queued trial keeps its low number however late it is popped.
    study = make_study()
    objective, optuna_study = study.objective, study.study
    params = objective.space.default_params()
    optuna_study.enqueue_trial(params)
    optuna_study.enqueue_trial(params)
    lower, higher = optuna_study.get_trials()
    storage, _ = study_identity(optuna_study)

    def start(queued: FrozenTrial) -> optuna.Trial:
        assert storage.set_trial_state_values(trial_id(queued), TrialState.RUNNING)
        trial = optuna.Trial(optuna_study, trial_id(queued))
        objective.space.suggest(trial)
        return trial

    first = start(higher)
    previous, _ = claim(optuna_study, first, params, objective.space, objective.claim_locks, objective.lock, objective.heartbeat)
    assert previous is None and records.is_measuring(optuna_study.trials[first.number])
    assert _copied_once_measured(study, start(lower), first) == first.number


def test_a_repeat_of_the_reference_waits_for_the_reference_that_runs(make_study) -> None:
    # A queued reference popped after another reference stored the scaling is an ordinary repeat
    # of it: it copies the reference, which measures without claiming.
    study = make_study()
    objective, optuna_study = study.objective, study.study
    params = objective.space.default_params()
    optuna_study.enqueue_trial(params, user_attrs={records.REFERENCE_KEY: True})
    optuna_study.enqueue_trial(params)
    reference, repeat = optuna_study.ask(), optuna_study.ask()
    for trial in (reference, repeat):
        objective.space.suggest(trial)
    assert _copied_once_measured(study, repeat, reference) == reference.number


def _copied_once_measured(study, waiting: optuna.Trial, measuring: optuna.Trial) -> int | None:
    """Claim ``waiting``'s configuration while ``measuring`` holds it, then finish ``measuring``:
    the number of the trial that ``waiting`` copies."""
    objective, optuna_study = study.objective, study.study
    with ThreadPoolExecutor(1) as pool:
        copied = pool.submit(
            claim, optuna_study, waiting, waiting.params, objective.space, objective.claim_locks, objective.lock, objective.heartbeat
        )
        records.record_result(measuring, MEASURED, {})
        optuna_study.tell(measuring, 1.0)
        previous, _ = copied.result(timeout=120)
    return None if previous is None else previous.number
