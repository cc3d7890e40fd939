"""No configuration measured twice: each trial claims its configuration under the study lock.

A trial whose configuration a completed trial measured copies that result; one whose
configuration another running trial claimed waits for it (:class:`~optuna_quant.storages.waiting.Waiter`),
then copies its result; otherwise it claims the configuration (:func:`optuna_quant.trial.records.claim`)
and measures it. The first claim under the lock wins, whatever the trial numbers and whenever a
queued trial is popped; a running reference trial holds the default configuration so. If the
claiming trial's worker dies, the heartbeat fails that trial and the next one claims.

The trials are read before the lock, and read again under it. The lock is the configuration's
(:func:`optuna_quant.storages.lock.claim_locks`): claims of two configurations do not wait on
each other where the storage has named locks, so that with tens of workers the claims do not
queue behind the study lock.

Example:
    >>> previous, seen = claim(study, trial, params, space, locks, lock, heartbeat)   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
import dataclasses
import hashlib
import json
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant._optuna_private import cached_trials
from optuna_quant._optuna_private import study_identity
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.samplers._coordination import held_params
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.lock import ClaimLocks
from optuna_quant.storages.lock import StudyLock
from optuna_quant.storages.waiting import Waiter
from optuna_quant.trial import records
from optuna_quant.trial.space import SearchSpace


def config_key(config: QuantConfig) -> str:
    """A digest of ``config`` that every process computes alike (a set's order is per process).

    Example:
        >>> config_key(QuantConfig(fallback=frozenset({"a", "b"}))) == config_key(QuantConfig(fallback=frozenset({"b", "a"})))
        True
    """
    fields = {**dataclasses.asdict(config), "fallback": sorted(config.fallback), "recovery": sorted(config.recovery)}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def claim(
    study: optuna.Study,
    trial: optuna.Trial,
    params: Mapping[str, Any],
    space: SearchSpace,
    locks: ClaimLocks,
    lock: StudyLock,
    heartbeat: Heartbeat | None,
) -> tuple[FrozenTrial | None, list[FrozenTrial]]:
    """The trial that measured ``params`` already, or ``None`` once ``trial`` claimed them.

    Configurations are compared as ``space`` builds them (:meth:`SearchSpace.to_config`): params
    that differ only in a scope their approach ignores are the same configuration.

    Args:
        locks: The locks of the configurations; the claim takes that of ``params``.
        lock: The study lock, under which a wait fails the trials of dead workers.

    Returns:
        That trial or ``None``, and the trials read to decide: the stop-on-target check and the
        trial's last log line reuse them.
    """
    names = list(params)
    config = space.to_config(params)
    config_lock = locks(config_key(config))
    storage, study_id = study_identity(study)

    def same(values: Mapping[str, Any]) -> bool:
        try:
            return space.to_config(values) == config
        except ValueError:  # a trial that has not set all its parameters yet
            return False

    def holds(other: FrozenTrial) -> bool:
        held = held_params(other, names)
        return held is not None and same(held)

    def taken(trials: Sequence[FrozenTrial]) -> tuple[FrozenTrial | None, str] | None:
        """The measured trial to copy, or what to wait for; ``None`` while the configuration is free."""
        for other in trials:
            # A pruned trial's configuration was slower than the best, which only gets faster.
            finished = other.state in (TrialState.COMPLETE, TrialState.PRUNED)
            if finished and records.measured(other) and same(other.params):
                return other, ""
        for other in trials:
            # A running reference measures the space's default configuration without a claim.
            measuring = records.is_measuring(other) or records.is_reference(other)
            if other.state == TrialState.RUNNING and measuring and holds(other):
                return None, f"trial {other.number}, which measures the same configuration"
        return None

    def look(trials: Sequence[FrozenTrial]) -> tuple[tuple[FrozenTrial | None, list[FrozenTrial]] | None, str]:
        found = taken(trials)
        if found is None:
            with config_lock():
                found = taken(storage.get_all_trials(study_id, deepcopy=False))
                if found is None:
                    records.claim(trial)
                    return (None, list(trials)), ""
        previous, what = found
        return ((previous, list(trials)), "") if previous is not None else (None, what)

    # The first look on the trials the sampler read for this trial: the claim reads them again under the lock.
    return Waiter(heartbeat).watch(lock, study, look, first=cached_trials(study))
