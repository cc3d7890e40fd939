"""Workers killed at random points of their trials, on every storage that workers may share: SQLite,
real PostgreSQL and MariaDB servers, a journal file, and Optuna's gRPC proxy in front of PostgreSQL.

Three worker processes (``tests/worker_script.py``) share one study. Workers SIGKILL themselves in
the middle of a stage (calibration, the reference, an evaluation, a latency measurement) and the
test SIGKILLs others at random moments of a running trial; each killed worker is replaced, so
that three keep working. Another run is interrupted with SIGINT (Ctrl-C) in every worker and
finished by a ``warm_start`` worker. After each the study must hold exactly the trials asked for,
every killed trial failed and run again once, no configuration measured twice, one reference,
and no worker may have waited longer than the grace period plus one trial.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
import random
import re
import signal
import subprocess
import sys
import time

from conftest import subprocess_env
import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState
import pytest

from optuna_quant.storages.factory import open_storage
from optuna_quant.storages.heartbeat import MAX_RETRY
from optuna_quant.study.worker import counted_trials
from optuna_quant.trial.records import is_reference
from optuna_quant.trial.records import WORKER_KEY


pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "worker_script.py"
INTERVAL, GRACE = 1, 3
N_TRIALS = 12
TIMEOUT = 240
# Where the three workers that start together kill themselves; replacements run to the end.
TOGETHER = ("eval:1", "latency:2", None)
RANDOM_KILLS = 2
_WAITED = re.compile(r"Waited (\d+\.\d) s for (.*)\.")


@dataclass
class Crew:
    """The worker processes of one study, and what happened to them."""

    url: str
    study: str
    running: list[subprocess.Popen[str]] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    killed: int = 0
    n_trials: int = N_TRIALS
    storage: optuna.storages.BaseStorage | None = None

    def start(self, *extra: str) -> subprocess.Popen[str]:
        worker = subprocess.Popen(
            [
                sys.executable, str(SCRIPT), self.url, "--study", self.study, "--n-trials", str(self.n_trials),
                "--heartbeat", f"{INTERVAL},{GRACE}", "--eval-sleep", "0.15", *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=subprocess_env(),
        )
        self.running.append(worker)
        return worker

    def reap(self) -> list[subprocess.Popen[str]]:
        """The workers that ended since the last call; a killed one is counted."""
        ended = [w for w in self.running if w.poll() is not None]
        for worker in ended:
            self.running.remove(worker)
            self.outputs.append(worker.stdout.read())
            if worker.returncode == -signal.SIGKILL:
                self.killed += 1
            else:
                assert worker.returncode == 0, self.outputs[-1][-3000:]
        return ended

    def stacks(self) -> str:
        """What every running worker is doing (``faulthandler`` in the worker script), ending them."""
        for worker in self.running:
            worker.send_signal(signal.SIGUSR1)
        time.sleep(1)
        for worker in self.running:
            worker.kill()
        return "\n".join(w.stdout.read()[-4000:] for w in self.running)

    def finish(self, who: str) -> None:
        """Start one more worker and wait for it to end the study (the stacks if it hangs)."""
        finisher = self.start()
        try:
            finisher.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{who} did not finish: {self.stacks()}") from None
        self.reap()

    def trials(self) -> list[FrozenTrial]:
        self.storage = self.storage or open_storage(self.url)  # one connection (or proxy) for every look
        try:
            return optuna.load_study(study_name=self.study, storage=self.storage).get_trials()
        except KeyError:  # not created yet
            return []


def _random_kill(crew: Crew, rng: random.Random) -> bool:
    """SIGKILL a worker some way into a trial it is running; whether one was found.

    Not in a trial retried ``MAX_RETRY`` times already, which Optuna's retry does not run again:
    under load, the reference killed at three stages could still be running its last retry.
    """
    running = {
        t.user_attrs.get(WORKER_KEY)
        for t in crew.trials()
        if t.state == TrialState.RUNNING and len(t.system_attrs.get("retry_history", ())) < MAX_RETRY
    }
    victims = [w for w in crew.running if f":{w.pid}" in " ".join(filter(None, running))]
    if not victims:
        return False
    time.sleep(rng.uniform(0.0, 0.4))
    victim = rng.choice(victims)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    return True


def _alone_until_killed(crew: Crew, stage: str) -> None:
    worker = crew.start("--die-at", stage)
    assert worker.wait(timeout=TIMEOUT) == -signal.SIGKILL, worker.stdout.read()[-3000:]
    crew.reap()


def _run_with_kills(crew: Crew, seed: int) -> None:
    # Alone, the first worker surely pops the reference and dies measuring it; the second waits
    # for the heartbeat to fail that trial, pops its retry and dies calibrating for it.
    _alone_until_killed(crew, "reference")
    _alone_until_killed(crew, "calibration")
    for stage in TOGETHER:
        crew.start(*(["--die-at", stage] if stage else []), "--seed", "0")
    rng = random.Random(seed)
    random_kills = 0
    deadline = time.monotonic() + TIMEOUT
    while crew.running:
        assert time.monotonic() < deadline, f"the workers did not finish: {crew.stacks()}"
        if random_kills < RANDOM_KILLS and len(crew.trials()) >= 5 + 3 * random_kills and _random_kill(crew, rng):
            random_kills += 1
        for worker in crew.reap():
            if worker.returncode == -signal.SIGKILL:  # replaced, so that three keep working
                crew.start("--seed", str(crew.killed))
        time.sleep(0.1)
    assert random_kills == RANDOM_KILLS
    assert crew.killed >= 5, crew.killed  # the eval:1 worker surely dies; latency:2 only if it gets two trials


def _assert_recovered(crew: Crew) -> None:
    trials = crew.trials()
    states = Counter(t.state for t in trials)
    assert states[TrialState.RUNNING] == states[TrialState.WAITING] == 0, states
    assert counted_trials(trials) == crew.n_trials  # exactly the trials asked for, a retried one once
    retries = Counter(n for t in trials for n in t.system_attrs.get("retry_history", ())[-1:])
    failed = [t.number for t in trials if t.state == TrialState.FAIL]
    # Each killed trial ran again once; else what the workers said of a trial that did not.
    lonely = [n for n in failed if retries[n] != 1]
    said = [line for output in crew.outputs for line in output.splitlines() if any(f"rial {n}" in line for n in lonely)]
    assert failed and not lonely, (failed, retries, [trials[n].user_attrs for n in lonely], said[-20:])
    assert set(retries) == set(failed)
    measured = Counter(tuple(sorted(t.params.items())) for t in trials if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs)
    twice = [
        (t.number, t.user_attrs, {k: v for k, v in t.system_attrs.items() if k != "optuna_quant:heartbeat"})
        for t in trials
        if measured[tuple(sorted(t.params.items()))] > 1
    ]
    assert not twice, f"a configuration was measured twice: {twice}"
    assert sum(1 for t in trials if is_reference(t) and t.state == TrialState.COMPLETE) == 1
    durations = [(t.datetime_complete - t.datetime_start).total_seconds() for t in trials if t.datetime_complete]
    # A dead worker's trial is failed GRACE s after its last beat (SQLite's clock counts whole
    # seconds, and waiters look every half second), then runs again once.
    bound = GRACE + INTERVAL + 1.5 + max(durations)
    waits = [(float(s), what) for output in crew.outputs for s, what in _WAITED.findall(output)]
    assert all(s <= bound for s, _ in waits), (bound, sorted(waits)[-3:])


def _interrupt_then_warm_start(crew: Crew, stalled: Path) -> None:
    # One worker stalls in an evaluation of a trial, so that Ctrl-C finds at least one trial
    # running however the others' trials and storage calls fall; the reference comes first.
    crew.start("--seed", "0", "--stall-at", "eval:6", "--stalled", str(stalled))
    for seed in (1, 2):
        crew.start("--seed", str(seed))
    deadline = time.monotonic() + TIMEOUT
    while sum(t.state == TrialState.COMPLETE for t in crew.trials()) < 4 or not stalled.exists():
        assert time.monotonic() < deadline, f"no worker stalled: {crew.stacks()}"
        time.sleep(0.1)
    # Only the workers still running: on a loaded machine one may have finished its last trial
    # while this loop read the study.
    interrupted_workers = [worker for worker in crew.running if worker.poll() is None]
    for worker in interrupted_workers:
        worker.send_signal(signal.SIGINT)
    assert interrupted_workers
    stopped_by_ctrl_c = 0
    for worker in list(crew.running):
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"a worker did not stop on Ctrl-C: {crew.stacks()}") from None
        crew.running.remove(worker)
        crew.outputs.append(worker.stdout.read())
        if worker.returncode != 0:
            assert "KeyboardInterrupt" in crew.outputs[-1], crew.outputs[-1][-3000:]
            stopped_by_ctrl_c += 1
        else:  # its last trial ended, and the budget with it, before the Ctrl-C reached Python
            assert "Best trial" in crew.outputs[-1], crew.outputs[-1][-3000:]
    assert stopped_by_ctrl_c >= 1
    interrupted = [t for t in crew.trials() if t.state == TrialState.FAIL]
    assert interrupted, ("no trial was running when Ctrl-C came", [output[-1500:] for output in crew.outputs])
    crew.finish("the warm-start worker")


@pytest.fixture
def url(shared_url: str) -> str:
    return shared_url


def test_workers_killed_at_random_points_lose_nothing(url: str) -> None:
    crew = Crew(url, "kills")
    _run_with_kills(crew, seed=len(url))
    _assert_recovered(crew)


def test_ctrl_c_in_every_worker_then_warm_start(url: str, tmp_path: Path) -> None:
    # Twice the budget, so that every worker still has trials to run when Ctrl-C comes, however
    # slowly a loaded machine lets this test read the study.
    crew = Crew(url, "interrupted", n_trials=2 * N_TRIALS)
    _interrupt_then_warm_start(crew, tmp_path / "stalled")
    _assert_recovered(crew)


def test_a_worker_killed_while_optuna_asks_leaves_no_trial_running_for_ever(url: str) -> None:
    """Killed after Optuna created its second trial, before the trial's first heartbeat: Optuna's
    heartbeat never fails a trial that never beat, and the next worker once waited on it for ever
    once the budget was used."""
    crew = Crew(url, "killed-asking", n_trials=4)
    _alone_until_killed(crew, "ask:2")
    assert [t.state for t in crew.trials()] == [TrialState.COMPLETE, TrialState.RUNNING]
    crew.finish("the next worker")
    _assert_recovered(crew)
    assert crew.trials()[1].state == TrialState.FAIL


def test_three_workers_with_a_budget_of_two_run_two_trials(url: str) -> None:
    crew = Crew(url, "budget-of-two", n_trials=2)
    for seed in range(3):
        crew.start("--seed", str(seed))
    for worker in crew.running:
        worker.wait(timeout=TIMEOUT)
    crew.reap()  # asserts that each exited 0, with its output
    trials = crew.trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2  # the reference and one trial
