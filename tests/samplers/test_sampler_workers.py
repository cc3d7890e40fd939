"""Worker processes with optuna-quant's samplers on one SQLite study never evaluate one configuration
twice (the claims of :mod:`optuna_quant.samplers._coordination`): three workers with one seed, the
hardest case (workers of one config file share its seed, and with the same data they make the same
choices), and two with their own seeds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
import subprocess
import sys

from conftest import subprocess_env
import optuna
import pytest


pytestmark = pytest.mark.slow  # two or three interpreters and 31 to 37 trials a case

WORKER = Path(__file__).parents[1] / "sampler_worker.py"


@pytest.mark.parametrize(
    ("sampler", "seeds", "trials_each"),
    [("tpe", (0, 0, 0), 10), ("gp", (0, 0, 0), 12), ("gp", (0, 1), 18)],
    ids=["tpe-three-one-seed", "gp-three-one-seed", "gp-two-own-seeds"],
)
def test_workers_never_share_a_configuration(
    tmp_path: Path, sampler: str, seeds: tuple[int, ...], trials_each: int
) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="workers", storage=url)
    # The default configuration first, as optuna-quant's studies measure it: before any trial has
    # parameters a sampler cannot know the search space.
    study.enqueue_trial({"l0": "int8", "l1": "int8", "l2": "int8", "l3": "int8", "est": "minmax"})
    sys.path.insert(0, str(WORKER.parent))
    try:
        from sampler_worker import objective
    finally:
        sys.path.pop(0)
    study.optimize(objective, n_trials=1)
    go = tmp_path / "go"
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), url, sampler, str(seed), str(trials_each), str(go)],
            cwd=Path(__file__).parents[2],
            env=subprocess_env(),
        )
        for seed in seeds
    ]
    go.touch()  # every worker asks for its first trial at once
    assert [w.wait(timeout=300) for w in workers] == [0] * len(seeds)

    trials = optuna.load_study(study_name="workers", storage=url).trials
    assert len(trials) == 1 + len(seeds) * trials_each
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    configs = Counter(tuple(sorted(t.params.items())) for t in trials)
    assert max(configs.values()) == 1, [c for c, n in configs.items() if n > 1]
    # Every worker process ran its own share of the trials, on the one shared study.
    pids = Counter(t.user_attrs["pid"] for t in trials[1:])
    assert pids == {w.pid: trials_each for w in workers}, pids
    # The workers ran side by side: some trial started before another worker's trial ended.
    overlapping = any(
        a.user_attrs["pid"] != b.user_attrs["pid"]
        and a.datetime_start < b.datetime_complete
        and b.datetime_start < a.datetime_complete
        for a in trials[1:]
        for b in trials[1:]
    )
    assert overlapping, (
        "the run was serialised: no two workers' trials overlapped in time (a loaded machine ran "
        "the workers one after another), so the never-repeat claims were not exercised concurrently"
    )
