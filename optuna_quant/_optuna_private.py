"""The one place that reaches into Optuna's private API, each use with its reason.

- ``Study._log_completed_trial``: the line Optuna logs for each completed trial of ``optimize``
  ("Trial 3 finished with value: ..."), which users read with ``--verbose``. The worker runs each
  trial itself, so that no read of every trial falls under the study lock (Optuna's ask reads them
  all to pop a queued trial), and logs it as Optuna does (:func:`log_completed_trial`).
- ``Study._storage`` and ``_CachedStorage``, with its ``_backend``: the RDB storage behind the cache
  Optuna wraps it in for a study. The cache says neither that a study's storage is an RDB one nor
  which database it opens, which decides the lock its workers share
  (:func:`storage_backend`, :func:`study_storage`).
- ``Study._get_trials(use_cache=True)`` and ``Study._thread_local.cached_all_trials``: the trials as
  Optuna read them once for the trial being asked for, which Optuna's own samplers read
  (:func:`cached_trials`); ``Study.ask`` forgets them for each new trial, and so does the worker,
  which pops or makes its trials itself (:func:`clear_trials_cache`). The public ``get_trials``
  reads the storage again: once per parameter for an independent suggestion, a query each on an
  RDB storage, and each time with what other workers wrote since.
- ``Study._storage`` and ``Study._study_id``: which study a sampler's caches hold, across the
  ``Study`` objects opened on it, for a name does not tell, as a deleted study's name can come
  back with other trials; and where the worker pops or makes its trial, through the storage's
  one-row calls (:func:`study_identity`).
- ``Trial._trial_id`` of a ``FrozenTrial`` or ``Trial`` and ``Study._storage``: a sampler's claim on
  a configuration is a system attribute of the trial being sampled, written before the trial has
  parameters (:mod:`optuna_quant.samplers._coordination`), and a running trial's heartbeat one
  that its worker rewrites (:mod:`optuna_quant.storages.heartbeat`). Optuna 5 has no public way
  to write a trial's system attribute; its own CMA-ES sampler writes its state this way
  (:func:`set_trial_system_attr`).
- ``FrozenTrial._trial_id``: the storage id of a trial read from a storage, which the storage's
  own methods take: the worker pops a queued trial through them, one storage call
  (:func:`trial_id`).
- The ``"fixed_params"`` system attribute: the parameters ``Study.enqueue_trial`` gives a trial
  that has not started, which no public accessor returns. The samplers exclude them from what
  other trials may choose (:func:`fixed_params`).
- ``_create_scoped_session``, the RDB storage's ``models`` and the upsert of
  ``RDBStorage._set_trial_attr_without_commit``, ``Trial._trial_id`` and
  ``Trial._cached_frozen_trial``: a trial's measurement, its user attributes and its constraints,
  written in one transaction of an RDB storage (:func:`set_trial_attrs`), where Optuna's API
  writes one attribute a transaction. The constraints are system attributes under Optuna's
  ``"constraints:<name>"`` keys (``Trial.set_constraint``, whose read of every system attribute
  before each write the measurement does not need).
- ``Trial._is_fixed_param``, ``Trial._is_relative_param``, ``Trial._fixed_params``,
  ``Trial._cached_frozen_trial``, ``_CachedStorage``'s ``_lock``, ``_studies`` and
  ``_trial_id_to_study_id_and_number``, and the RDB storage's ``models`` as
  ``RDBStorage._set_trial_param_without_commit`` writes them: a trial's parameters written in one
  transaction of an RDB storage, with one read of the trial and one INSERT, chosen as
  ``Trial._suggest`` chooses each (an enqueued value, the sampler's relative sample), where
  ``suggest_*`` writes one parameter a transaction, reading the trial each time
  (:func:`set_trial_params`).
- The loggers of Optuna's lines of a finished trial (``optuna.study.study``) and of a failed one
  (``optuna.study._optimize``) and those lines' form, which lists every parameter: on a model of
  48 layers, 53 of them. :func:`optuna_quant.logs.compact_trial_lines` sums the layers up in them
  (:data:`TRIAL_LINE_LOGGERS`).
"""

from __future__ import annotations

from collections.abc import Mapping
import json
import math
import sqlite3
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.storages import RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY
from optuna.trial import FrozenTrial


# Study.enqueue_trial's key (optuna.study.Study.enqueue_trial, read by optuna.trial.Trial).
_FIXED_PARAMS_KEY = "fixed_params"
TRIAL_LINE_LOGGERS = ("optuna.study.study", "optuna.study._optimize")
"""The loggers of "Trial N finished with value: ... and parameters: {...}" (``Study._log_completed_trial``)
and of "Trial N failed with parameters: {...} because of ..." (``_optimize._log_failed_trial``)."""


def log_completed_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Optuna's log line of a completed trial, as ``Study.optimize`` writes it."""
    study._log_completed_trial(trial.values, trial.number, trial.params)


def storage_backend(storage: BaseStorage) -> BaseStorage:
    """``storage`` without the cache Optuna wraps an RDB storage in for a study."""
    # Not any ``_backend``: a journal storage names its log's backend so.
    return storage._backend if isinstance(storage, _CachedStorage) else storage


def study_storage(study: optuna.Study) -> BaseStorage:
    """The storage ``study`` was opened on: an RDB storage without the cache Optuna wraps it in."""
    return storage_backend(study._storage)


def cached_trials(study: optuna.Study) -> list[FrozenTrial]:
    """``study``'s trials as Optuna read them for the trial being asked for; not to be modified."""
    return study._get_trials(deepcopy=False, use_cache=True)


def clear_trials_cache(study: optuna.Study) -> None:
    """Forget the trials read for the last trial, as ``Study.ask`` does before a new one."""
    study._thread_local.cached_all_trials = None


def study_identity(study: optuna.Study) -> tuple[BaseStorage, int]:
    """The storage ``study`` holds (with Optuna's cache, if any) and the study's id in it."""
    return study._storage, study._study_id


def set_trial_system_attr(study: optuna.Study, trial: FrozenTrial | optuna.Trial, key: str, value: Any) -> None:
    """Write the system attribute ``key`` of ``study``'s ``trial``, which may be running."""
    study._storage.set_trial_system_attr(trial._trial_id, key, value)


def set_trial_attrs(trial: optuna.Trial, user_attrs: Mapping[str, Any], constraints: Mapping[str, float] | None = None) -> None:
    """Write ``trial``'s user attributes and constraints, in one transaction on an RDB storage.

    A constraint is feasible at zero or less, as ``Trial.set_constraint`` takes it; one already
    set is written again.

    Raises:
        ValueError: If a constraint is NaN.
    """
    system_attrs = {f"{_CONSTRAINTS_KEY}:{key}": float(value) for key, value in (constraints or {}).items()}
    if any(math.isnan(value) for value in system_attrs.values()):
        raise ValueError(f"a constraint is NaN: {dict(constraints or {})}")
    backend = storage_backend(trial.storage)
    if isinstance(backend, RDBStorage):
        # Here, not at the top: it imports SQLAlchemy's ORM, which a study on another storage never needs.
        from optuna.storages._rdb import models

        with _create_scoped_session(backend.scoped_session, True) as session:
            state = models.TrialModel.find_or_raise_by_id(trial._trial_id, session).state
            backend.check_trial_is_updatable(trial._trial_id, state)
            _upsert(backend, session, models.TrialUserAttributeModel, trial._trial_id, user_attrs)
            _upsert(backend, session, models.TrialSystemAttributeModel, trial._trial_id, system_attrs)
    else:
        for key, value in user_attrs.items():
            trial.storage.set_trial_user_attr(trial._trial_id, key, value)
        for key, value in system_attrs.items():
            trial.storage.set_trial_system_attr(trial._trial_id, key, value)
    trial._cached_frozen_trial.user_attrs.update(user_attrs)
    trial._cached_frozen_trial.system_attrs.update(system_attrs)


def set_trial_params(trial: optuna.Trial, distributions: Mapping[str, BaseDistribution]) -> None:
    """Write the parameters of ``distributions`` that ``trial`` knows without its sampler's
    ``sample_independent``, in one transaction on an RDB storage, as ``Trial._suggest`` would
    choose and write each: ``trial.suggest_*`` then reads them back. The others are left to
    ``suggest_*``, and so is every parameter on another storage.

    Raises:
        ValueError: As ``suggest_*`` raises it, for a distribution that differs from the one the
            study holds under the name.
    """
    storage = trial.storage
    backend = storage_backend(storage)
    if not (isinstance(storage, _CachedStorage) and isinstance(backend, RDBStorage)):
        return
    known = trial._cached_frozen_trial.distributions
    chosen: dict[str, Any] = {}
    for name, distribution in distributions.items():
        if name in known:
            continue
        if trial._is_fixed_param(name, distribution):
            chosen[name] = trial._fixed_params[name]
        elif not distribution.single() and trial._is_relative_param(name, distribution):
            chosen[name] = trial.relative_params[name]
    if not chosen:
        return
    with storage._lock:
        study_id, _ = storage._trial_id_to_study_id_and_number[trial._trial_id]
        held = storage._studies[study_id].param_distribution
        with _create_scoped_session(backend.scoped_session, True) as session:
            _add_trial_params(backend, session, trial._trial_id, distributions, chosen, held)
        for name in chosen:
            held.setdefault(name, distributions[name])
    for name, value in chosen.items():
        trial._cached_frozen_trial.distributions[name] = distributions[name]
        trial._cached_frozen_trial.params[name] = value


def _add_trial_params(
    backend: RDBStorage,
    session: Any,
    trial_id: int,
    distributions: Mapping[str, BaseDistribution],
    values: Mapping[str, Any],
    held: Mapping[str, BaseDistribution],
) -> None:
    """``values`` added to the trial's parameters, each under its entry of ``distributions`` and
    checked as ``RDBStorage._set_trial_param_without_commit`` checks one, with one read of the
    trial and one INSERT for them all.

    Optuna's reads the trial again for each parameter, and each read first flushes the INSERT of
    the one before: two statements a parameter. ``held``: the distributions the study holds, as
    Optuna's cache gives them; one it does not hold is read from the study's trials, as there.

    Raises:
        ValueError: For a distribution that differs from the one the study holds under the name.
    """
    # As in set_trial_attrs: SQLAlchemy only here.
    from optuna.storages._rdb import models
    import sqlalchemy

    stored = models.TrialModel.find_or_raise_by_id(trial_id, session)
    backend.check_trial_is_updatable(trial_id, stored.state)
    for name in values:
        distribution, previous = distributions[name], held.get(name)
        if previous is None:
            record = (
                session.query(models.TrialParamModel)
                .join(models.TrialModel)
                .filter(models.TrialModel.study_id == stored.study_id)
                .filter(models.TrialParamModel.param_name == name)
                .first()
            )
            previous = None if record is None else optuna.distributions.json_to_distribution(record.distribution_json)
        if previous is not None:
            optuna.distributions.check_distribution_compatibility(previous, distribution)
    rows = [
        {
            "trial_id": trial_id,
            "param_name": name,
            "param_value": distributions[name].to_internal_repr(value),
            "distribution_json": optuna.distributions.distribution_to_json(distributions[name]),
        }
        for name, value in values.items()
    ]
    # Core's executemany, not the ORM's unit of work: on SQLite that inserts row by row to read
    # back each id, which nothing here needs.
    session.execute(sqlalchemy.insert(models.TrialParamModel), rows)


def _upsert(backend: RDBStorage, session: Any, model: Any, trial_id: int, attrs: Mapping[str, Any]) -> None:
    """``attrs`` written as ``model`` rows of the trial in one statement, as Optuna's
    ``_set_trial_attr_without_commit`` writes one; one statement each on other databases."""
    if not attrs:
        return
    rows = [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)} for key, value in attrs.items()]
    dialect = backend.engine.name
    if dialect == "mysql":
        from sqlalchemy.dialects import mysql

        statement = mysql.insert(model).values(rows)
        session.execute(statement.on_duplicate_key_update(value_json=statement.inserted.value_json))
    elif dialect == "postgresql" or (dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 24, 0)):
        from sqlalchemy.dialects import postgresql
        from sqlalchemy.dialects import sqlite

        statement = (postgresql if dialect == "postgresql" else sqlite).insert(model).values(rows)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=[model.trial_id, model.key], set_={"value_json": statement.excluded.value_json}
            )
        )
    else:
        for key, value in attrs.items():
            backend._set_trial_attr_without_commit(session, model, trial_id, key, value)


def trial_id(trial: FrozenTrial) -> int:
    """The storage id of ``trial``, as the storage's methods take it."""
    return trial._trial_id


def fixed_params(trial: FrozenTrial) -> dict[str, Any] | None:
    """The parameters ``Study.enqueue_trial`` gave ``trial``; ``None`` when it gave none."""
    return trial.system_attrs.get(_FIXED_PARAMS_KEY)
