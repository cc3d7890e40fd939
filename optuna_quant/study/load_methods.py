"""POT's ``trials_load_method`` on Optuna: which study a run works on, and when it is replaced.

========== ===================================================================================
cold_start a fresh study: an existing study of that name is deleted, and the log says so
warm_start load the study and continue up to ``max_trials`` trials in total
fine_tune  a new study (``<name>-fine_tune``) whose space is narrowed around the best result of
           the previous one
eval       run no trial: rebuild and export the best model of the stored study
========== ===================================================================================

A missing study under warm_start or fine_tune falls back to cold_start, with a log line. Loading is
split in two so that nothing stored is touched before every check passed: :func:`plan_load` only
reads, and :func:`open_study`, called once the model, data and settings are checked, deletes (under
cold_start) and creates.

Example:
    >>> import optuna
    >>> storage = optuna.storages.InMemoryStorage()
    >>> plan = plan_load("warm_start", "demo", storage, scopes=("layer",), targets=None)
    >>> plan.method, plan.name, plan.existing is None
    ('cold_start', 'demo', True)
"""

from __future__ import annotations

from dataclasses import dataclass
import logging

import optuna

from optuna_quant.measure.loss import Targets
from optuna_quant.storages.urls import describe
from optuna_quant.trial import records
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.space import SearchSpace


_logger = logging.getLogger("optuna_quant")

TRIALS_LOAD_METHODS = ("cold_start", "warm_start", "fine_tune", "eval")
FINE_TUNE_SUFFIX = "-fine_tune"
DIRECTIONS = {"loss": ["minimize"], "pareto": ["minimize", "maximize"]}


@dataclass(frozen=True)
class LoadPlan:
    """What a run will do to the storage, decided without writing to it.

    Attributes:
        method: The load method, after the fallback to cold_start.
        name: The study's name (a fine-tune study's carries :data:`FINE_TUNE_SUFFIX`).
        space: The space the study must use: a fine-tune study's narrowed one, the stored one
            under eval; ``None`` to take the model's.
        existing: The study of that name already stored, or ``None``.
    """

    method: str
    name: str
    space: SearchSpace | None
    existing: optuna.Study | None


def plan_load(
    method: str,
    study_name: str,
    storage: optuna.storages.BaseStorage,
    *,
    scopes: tuple[str, ...],
    targets: Targets | None,
    sampler: optuna.samplers.BaseSampler | None = None,
    int8_class: str | None = None,
) -> LoadPlan:
    """Read what ``method`` needs from ``storage``; write nothing.

    Args:
        int8_class: This machine's CPU int8 class, which a warm-started study must be tuned on.

    Raises:
        ValueError: For an unknown method; under eval, a missing study or one made outside
            optuna-quant; under fine_tune, a previous study with no completed trial; under
            warm_start, a study tuned on CPUs of another int8 class.
    """
    if method not in TRIALS_LOAD_METHODS:
        raise ValueError(f"Unknown trials_load_method {method!r}; choose from {TRIALS_LOAD_METHODS}.")
    space = None
    name = study_name
    if method == "fine_tune":
        previous = _load_or_none(study_name, storage)
        if previous is None:
            _logger.info("No study %r to fine-tune: starting with cold_start.", study_name)
            method = "cold_start"
        else:
            space = _narrowed_space(previous, scopes, targets or Targets())
            name = study_name + FINE_TUNE_SUFFIX
    existing = _load_or_none(name, storage, sampler)
    if method == "eval":
        if existing is None:
            raise ValueError(f"No study {name!r} in {describe(storage)} to evaluate; run the tuning first.")
        space = records.stored_space(existing)
    elif method == "warm_start" and existing is None:
        _logger.info("No study %r to warm-start: starting with cold_start.", name)
        method = "cold_start"
    elif method == "warm_start" and int8_class is not None:
        records.check_int8_class(existing, int8_class)
    return LoadPlan(method, name, space, existing)


def open_study(
    plan: LoadPlan,
    storage: optuna.storages.BaseStorage,
    sampler: optuna.samplers.BaseSampler,
    objective_mode: str,
    pruner: optuna.pruners.BasePruner | None = None,
) -> optuna.Study:
    """The study of ``plan``, with ``sampler`` and ``pruner`` (none: no trial is pruned); under
    cold_start an existing one is deleted first.

    Raises:
        ValueError: If a loaded study has another number of objectives than ``objective_mode``.
    """
    directions = DIRECTIONS[objective_mode]
    if plan.method == "eval":
        assert plan.existing is not None
        return plan.existing  # no trial runs: no pruner needed
    if plan.method == "cold_start" and plan.existing is not None:
        _logger.info("cold_start: deleting the existing study %r.", plan.name)
        optuna.delete_study(study_name=plan.name, storage=storage)
    study = optuna.create_study(
        study_name=plan.name,
        storage=storage,
        sampler=sampler,
        pruner=pruner or optuna.pruners.NopPruner(),
        directions=directions,
        load_if_exists=True,
    )
    if len(study.directions) != len(directions):
        raise ValueError(
            f"Study {plan.name!r} has {len(study.directions)} objective(s), not {objective_mode!r} mode's "
            f"{len(directions)}; use another study name or cold_start."
        )
    return study


def _load_or_none(
    study_name: str, storage: optuna.storages.BaseStorage, sampler: optuna.samplers.BaseSampler | None = None
) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
    except KeyError:
        return None


def _narrowed_space(previous: optuna.Study, scopes: tuple[str, ...], targets: Targets) -> SearchSpace:
    space = records.stored_space(previous)
    best = best_trial(previous.get_trials(deepcopy=False), targets)
    if best is None:
        raise ValueError(f"Study {previous.study_name!r} has no completed trial to fine-tune around.")
    _logger.info("fine_tune: narrowing to %s around trial %d.", sorted(scopes), best.number)
    return space.narrow(space.to_config(best.params), scopes)
