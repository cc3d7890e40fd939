"""Three worker processes with one seed on one SQLite study never evaluate one configuration twice,
with either of optuna-quant's samplers (the claims of :mod:`optuna_quant.samplers._coordination`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
import subprocess
import sys

import optuna
import pytest

from conftest import subprocess_env

pytestmark = pytest.mark.slow  # three interpreters and 31 trials per sampler

WORKER = Path(__file__).parents[1] / "sampler_worker.py"
N_WORKERS, TRIALS_EACH = 3, 10


@pytest.mark.parametrize("sampler", ["tpe", "gp"])
def test_three_workers_with_one_seed_never_share_a_configuration(tmp_path: Path, sampler: str) -> None:
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
            [sys.executable, str(WORKER), url, sampler, "0", str(TRIALS_EACH), str(go)],
            cwd=Path(__file__).parents[2],
            env=subprocess_env(),
        )
        for _ in range(N_WORKERS)
    ]
    go.touch()  # every worker asks for its first trial at once
    assert [w.wait(timeout=300) for w in workers] == [0] * N_WORKERS

    trials = optuna.load_study(study_name="workers", storage=url).trials
    assert len(trials) == 1 + N_WORKERS * TRIALS_EACH
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    configs = Counter(tuple(sorted(t.params.items())) for t in trials)
    assert max(configs.values()) == 1, [c for c, n in configs.items() if n > 1]
    pids = Counter(t.user_attrs["pid"] for t in trials[1:])
    assert pids == {w.pid: TRIALS_EACH for w in workers}
    # The workers ran side by side: some trial started before another worker's trial ended.
    overlapping = any(
        a.user_attrs["pid"] != b.user_attrs["pid"]
        and a.datetime_start < b.datetime_complete
        and b.datetime_start < a.datetime_complete
        for a in trials[1:]
        for b in trials[1:]
    )
    assert overlapping
