"""Several worker processes on one study in a real PostgreSQL server that the tests start.

Each worker is a real OS process (``tests/worker_script.py``) running ``create_study(...,
trials_load_method="warm_start")`` and ``optimize``; the tests read the study back from the
database and check what every worker promised: the budget, the shared reference, no configuration
measured twice, stop_on_target, and a killed worker's trial run again.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
import signal
import socket
import subprocess
import sys

from conftest import subprocess_env
import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState
import pytest

from optuna_quant.measure.loss import Targets
from optuna_quant.study.worker import counted_trials
from optuna_quant.testing.postgres import postgresql_psycopg2
from optuna_quant.trial.records import is_reference
from optuna_quant.trial.records import SCALING_KEY
from optuna_quant.trial.records import TARGETS_KEY
from optuna_quant.trial.records import WORKER_KEY
from optuna_quant.trial.stopping import meets_targets
from optuna_quant.trial.stopping import target_reached


pytestmark = pytest.mark.postgres

SCRIPT = Path(__file__).parents[1] / "worker_script.py"
TIMEOUT = 90


def _start(url: str, study: str, n_trials: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), url, "--study", study, "--n-trials", str(n_trials), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env(),
    )


def _finish(workers: list[subprocess.Popen[str]]) -> list[str]:
    """Each worker's output, once all of them exited well."""
    outputs = []
    for worker in workers:
        output, _ = worker.communicate(timeout=TIMEOUT)
        assert worker.returncode == 0, output[-3000:]
        outputs.append(output)
    return outputs


def _trials(url: str, study: str) -> list[FrozenTrial]:
    return optuna.load_study(study_name=study, storage=url).get_trials()


def _assert_complete_study(trials: list[FrozenTrial], n_trials: int) -> None:
    states = Counter(t.state for t in trials)
    assert states[TrialState.RUNNING] == 0 and states[TrialState.WAITING] == 0, states
    assert counted_trials(trials) == n_trials
    # A killed reference trial stays FAIL beside the run that replaced it: one completed reference.
    references = [(t.number, t.state.name, t.user_attrs.get(WORKER_KEY), t.system_attrs.get("failed_trial")) for t in trials if is_reference(t)]
    assert sum(1 for t in trials if is_reference(t) and t.state == TrialState.COMPLETE) == 1, references
    measured = [
        tuple(sorted(t.params.items()))
        for t in trials
        if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs
    ]
    assert len(measured) == len(set(measured)), "a configuration was measured twice"


def test_three_workers_share_the_budget_and_measure_nothing_twice(postgres_url: str) -> None:
    assert postgres_url.startswith("postgresql://")  # as the docs show it: psycopg 3
    # With the study's sensitivity: measured once, its start-up trials queued once for all three.
    workers = [_start(postgres_url, "three", 15, "--seed", str(seed), "--sensitivity") for seed in range(3)]
    outputs = _finish(workers)
    trials = _trials(postgres_url, "three")
    assert len(trials) == 15
    _assert_complete_study(trials, 15)
    study = optuna.load_study(study_name="three", storage=postgres_url)
    assert set(study.user_attrs[SCALING_KEY]) >= {"acc_scale", "lat_scale"}
    measured_by = {t.user_attrs.get(WORKER_KEY) for t in trials if "duplicate_of" not in t.user_attrs}
    assert len(measured_by) >= 2, "the workers did not share the study"
    # Where no worker stored it: what each said of the sensitivity and of its trials.
    said = [line for output in outputs for line in output.splitlines() if "ensitivity" in line or "rial" in line]
    assert "sensitivity" in study.user_attrs, (study.user_attrs.get("sensitivity_plan"), said[-40:])
    assert set(study.user_attrs["sensitivity"]) == {"conv1", "conv2", "fc"}
    assert study.user_attrs["sensitivity_plan"]["plan"] == "full"  # one worker's claim, measured


def test_stop_on_target_stops_every_worker_within_one_trial(postgres_url: str) -> None:
    # Every configuration meets these targets: the first trial to finish stops all three workers.
    easy = ["--accuracy-loss", "50", "--latency-reduce", "0.05", "--stop-on-target", "--eval-sleep", "0.5"]
    workers = [_start(postgres_url, "stop", 40, "--seed", str(seed), *easy) for seed in range(3)]
    _finish(workers)
    study = optuna.load_study(study_name="stop", storage=postgres_url)
    targets = Targets(**study.user_attrs[TARGETS_KEY])
    assert (targets.accuracy_loss, targets.latency_reduce) == (50.0, 0.05)
    first = target_reached(study.trials, targets)
    assert first is not None
    # No worker asked for a trial once one had met both targets: the later trials were already
    # running then (at most the other two workers' trials).
    met = min(t.datetime_complete for t in study.trials if meets_targets(t, targets) and not t.user_attrs.get("reference"))
    started_after = [t.number for t in study.trials if t.datetime_start > met]
    assert started_after == [], started_after
    later = [t for t in study.trials if t.number > first]
    assert len(later) <= 2, [(t.number, t.state) for t in later]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)


def test_the_psycopg2_url_form_works_too(postgres_url: str) -> None:
    url = postgresql_psycopg2(postgres_url)
    _finish([_start(url, "psycopg2", 3)])
    trials = _trials(url, "psycopg2")
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3


def test_killed_worker_trial_is_failed_by_heartbeat_and_run_again(postgres_url: str) -> None:
    # Worker 0 is killed in the latency measurement of its first trial.
    workers = [
        _start(postgres_url, "kill", 12, "--seed", str(seed), "--eval-sleep", "0.4", *(["--die-at", "latency:1"] if seed == 0 else []))
        for seed in range(3)
    ]
    assert workers[0].wait(timeout=TIMEOUT) == -signal.SIGKILL
    _finish(workers[1:])
    trials = _trials(postgres_url, "kill")
    (killed,) = [t for t in trials if t.user_attrs.get(WORKER_KEY) == f"{socket.gethostname()}:{workers[0].pid}"]
    assert killed.state == TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].params == killed.params
    _assert_complete_study(trials, 12)


def test_warm_start_after_an_interrupted_run_keeps_every_trial(postgres_url: str) -> None:
    # Evaluations: the fp32 model, the reference, then one per trial: the 5th is trial 3's.
    first = _start(postgres_url, "resume", 8, "--die-at", "eval:5")
    first.wait(timeout=TIMEOUT)
    assert first.returncode == -signal.SIGKILL
    before = _trials(postgres_url, "resume")
    victim = before[-1]
    assert victim.number == 3 and victim.state == TrialState.RUNNING
    _finish([_start(postgres_url, "resume", 8)])
    trials = _trials(postgres_url, "resume")
    assert [(t.number, t.params, t.state) for t in trials[:3]] == [(t.number, t.params, t.state) for t in before[:3]]
    assert trials[3].state == TrialState.FAIL
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == 3]
    assert retry.state == TrialState.COMPLETE and retry.params == victim.params
    _assert_complete_study(trials, 8)
