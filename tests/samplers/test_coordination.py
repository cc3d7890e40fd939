"""The claims of :mod:`optuna_quant.samplers._coordination`, in one process: two samplers with one
seed on one study, a trial that has not chosen yet, and the wait's bound."""

from __future__ import annotations

from pathlib import Path
import time

import optuna
import pytest

from optuna_quant.samplers import DiscreteGPSampler
from optuna_quant.samplers import TPESampler
from optuna_quant.samplers._coordination import CLAIM_KEY
from optuna_quant.samplers._coordination import wait_bound


optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {f"l{i}": optuna.distributions.CategoricalDistribution(["int8", "fp32"]) for i in range(5)}


def first_trial(study: optuna.Study) -> None:
    study.enqueue_trial({name: "int8" for name in SPACE})
    trial = study.ask(SPACE)
    study.tell(trial, 5.0)


@pytest.mark.parametrize("make", [lambda: TPESampler(seed=0), lambda: DiscreteGPSampler(seed=0)], ids=["tpe", "gp"])
def test_the_lower_trial_keeps_a_configuration_and_the_higher_one_chooses_another(make) -> None:
    # Two workers with one seed: two samplers alike, asking on one study before either sets a
    # parameter, which is when they would make the same choice.
    storage = optuna.storages.InMemoryStorage()
    study_a = optuna.create_study(storage=storage, study_name="s", sampler=make())
    first_trial(study_a)
    study_b = optuna.load_study(storage=storage, study_name="s", sampler=make())
    lower, higher = study_a.ask(), study_b.ask()
    # Optuna samples a trial's relative parameters when they are first needed: the lower trial
    # chooses (and claims), then the higher one, and only then does either set a parameter.
    lower_config, higher_config = lower.relative_params, higher.relative_params
    assert len(lower_config) == len(SPACE) and len(higher_config) == len(SPACE)
    assert CLAIM_KEY in storage.get_trial(lower._trial_id).system_attrs
    assert lower_config != higher_config
    # Alone, the second sampler would have chosen what the first did: the claim made the difference.
    alone = optuna.create_study(sampler=make())
    first_trial(alone)
    assert alone.ask().relative_params == lower_config


def test_a_trial_waits_boundedly_for_a_lower_one_that_has_not_chosen() -> None:
    study = optuna.create_study(sampler=TPESampler(seed=0, claim_wait_seconds=0.5))
    first_trial(study)
    # A trial that was created but has not chosen yet: its worker died, or is still sampling.
    study._storage.create_new_trial(study._study_id)
    start = time.monotonic()
    trial = study.ask(SPACE)
    assert time.monotonic() - start >= 0.5
    assert trial.number == 2 and set(trial.params) == set(SPACE)
    # Once the lower trial has chosen (here, set its parameters), no one waits for it.
    study.tell(trial, 1.0)
    start = time.monotonic()
    study.ask(SPACE)
    assert time.monotonic() - start >= 0.5  # trial 1 still holds nothing


def test_the_wait_never_outlasts_the_heartbeat_grace_period(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        beating = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=2)
    assert wait_bound(beating, 5.0) == 2.0
    assert wait_bound(beating, 1.0) == 1.0
    assert wait_bound(optuna.storages.RDBStorage(url), 5.0) == 5.0
    # As a study holds it, behind Optuna's cache.
    study = optuna.create_study(storage=beating)
    assert wait_bound(study._storage, 5.0) == 2.0
