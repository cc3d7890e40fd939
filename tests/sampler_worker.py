"""One worker of a shared study for the sampler concurrency tests, run as its own OS process.

It loads the study, waits for the test's go file (so that the workers ask for their trials at the
same moment), and runs a plain Optuna objective on a small finite space with one of
optuna-quant's samplers.

Example:
    $ python tests/sampler_worker.py sqlite:///study.db tpe 0 10 go.flag
"""

from __future__ import annotations

import os
from pathlib import Path
import sys
import time

import optuna

from optuna_quant.samplers.factory import make_sampler


CHOICES = {"l0": ["int8", "fp32"], "l1": ["int8", "fp32"], "l2": ["int8", "fp32"], "l3": ["int8", "fp32"]}
ESTIMATORS = ["minmax", "entropy", "p99"]


def objective(trial: optuna.Trial) -> float:
    """A quantization-shaped objective: fewer fp32 layers is faster, each costs accuracy."""
    bits = [trial.suggest_categorical(name, choices) for name, choices in CHOICES.items()]
    estimator = trial.suggest_categorical("est", ESTIMATORS)
    trial.set_user_attr("pid", os.getpid())
    time.sleep(0.05)  # long enough for the workers' trials to overlap
    trial.set_constraint("accuracy", 0.01 * bits.count("int8") - 0.025)
    return -bits.count("int8") - (estimator == "entropy")


def main(argv: list[str]) -> int:
    url, sampler, seed, n_trials, go = argv[0], argv[1], int(argv[2]), int(argv[3]), Path(argv[4])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    study = optuna.load_study(study_name="workers", storage=storage, sampler=make_sampler(sampler, seed=seed))
    while not go.exists():
        time.sleep(0.01)
    study.optimize(objective, n_trials=n_trials)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
