"""Worker processes sharing one SQLite study with DiscreteGPSampler never repeat a configuration."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
import subprocess
import sys
import textwrap

import optuna
import pytest

from conftest import subprocess_env

pytestmark = pytest.mark.slow  # two or three interpreters and 37 trials: about 6 s each

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import optuna
    from optuna_quant.samplers import DiscreteGPSampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url, seed, n_trials = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    study = optuna.load_study(study_name="workers", storage=storage, sampler=DiscreteGPSampler(seed=seed))

    def objective(trial):
        bits = [trial.suggest_categorical(f"l{i}", ["int8", "fp32"]) for i in range(4)]
        est = trial.suggest_categorical("est", ["minmax", "entropy", "p99"])
        trial.set_user_attr("pid", os.getpid())  # which worker ran the trial
        time.sleep(0.05)  # long enough for the two workers' trials to overlap
        trial.set_constraint("accuracy", 0.01 * bits.count("int8") - 0.025)
        return -bits.count("int8") - (est == "entropy")

    study.optimize(objective, n_trials=n_trials)
    """
)


def objective_reference(trial: optuna.Trial) -> float:
    """The default configuration, evaluated first as optuna-quant's studies do."""
    for i in range(4):
        trial.suggest_categorical(f"l{i}", ["int8", "fp32"])
    trial.suggest_categorical("est", ["minmax", "entropy", "p99"])
    trial.set_constraint("accuracy", 0.015)
    return -4.0


# Workers of one config file share its seed; with the same data they make the same choices, the
# hardest case for the claims.
@pytest.mark.parametrize("seeds", [(0, 1), (0, 0, 0)], ids=["two-own-seeds", "three-one-seed"])
def test_workers_never_evaluate_the_same_configuration(tmp_path: Path, seeds: tuple[int, int]) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="workers", storage=url)
    # One finished trial tells both workers the search space from their first trial on; before
    # any trial has parameters a sampler cannot know the space.
    study.enqueue_trial({"l0": "int8", "l1": "int8", "l2": "int8", "l3": "int8", "est": "minmax"})
    study.optimize(objective_reference, n_trials=1)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), url, str(seed), str(36 // len(seeds))],
            cwd=Path(__file__).parents[2],
            env=subprocess_env(),
        )
        for seed in seeds
    ]
    assert [w.wait(timeout=300) for w in workers] == [0] * len(seeds)

    trials = optuna.load_study(study_name="workers", storage=url).trials
    configs = [tuple(sorted(t.params.items())) for t in trials]
    assert len(trials) == 37 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len(set(configs)) == len(configs), "two trials evaluated the same configuration"
    # Every worker process ran its own share of the trials, on the one shared study.
    pids = Counter(t.user_attrs.get("pid") for t in trials[1:])
    assert len(pids) >= 2 and pids == {w.pid: 36 // len(seeds) for w in workers}, pids
    # The workers really ran side by side.
    starts = sorted((t.datetime_start, t.datetime_complete) for t in trials[1:])
    assert any(b[0] < a[1] for a, b in zip(starts, starts[1:])), (
        "the run was serialised: no two workers' trials overlapped in time (a loaded machine ran "
        "the workers one after another), so the never-repeat claims were not exercised concurrently"
    )
