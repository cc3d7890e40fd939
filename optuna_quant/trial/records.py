"""The records a study keeps: the one module that reads and writes what optuna-quant stores.

Study user attrs, written when the study is made or by its reference trial, then only read:
the search space, the targets, the model's fingerprint, the node-to-module map of a torch model,
the fp32 accuracy and latency, the loss scaling of the reference, the per-layer sensitivity
measured after it (:mod:`optuna_quant.trial.guidance`) and the choices learnt to fail
(:class:`ForbiddenChoice`, :mod:`optuna_quant.trial.failures`). Trial user attrs: the
measurement (``acc_loss``, ``lat_diff``...), its loss, the worker that ran the trial, the
reference flag, the trial a duplicate copied and the reason of a failure.

A stored space equals another when their Optuna distributions are equal (the same parameters with
the same choices): that one rule decides whether a worker may join a study. Writes that depend on
what is read (:func:`share_records`, :func:`store_reference`) run under the study lock.

Example:
    >>> import optuna
    >>> from optuna_quant.measure.loss import Targets
    >>> from optuna_quant.trial.space import SearchSpace
    >>> study = optuna.create_study()
    >>> space = SearchSpace(nodes=("conv",), scopes=frozenset({"layer"}))
    >>> share_records(study, space=space, fingerprint="abc", targets=Targets()) == space
    True
    >>> share_records(study, space=space, fingerprint="other", targets=Targets())
    Traceback (most recent call last):
    ...
    ValueError: Study 'no-name-...' was made with another model sha256 ('abc', here 'other'); use another study name or cold_start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from dataclasses import dataclass
import os
import socket
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from optuna_quant.measure.loss import LossScaling
from optuna_quant.measure.loss import Targets
from optuna_quant.trial.space import SearchSpace

FP32_ACCURACY_KEY = "fp32_accuracy"
FP32_LATENCY_KEY = "fp32_latency_ms"
SCALING_KEY = "loss_scaling"
SPACE_KEY = "search_space"
TARGETS_KEY = "targets"
MODEL_KEY = "model_sha256"
MODULES_KEY = "module_of_node"
REFERENCE_KEY = "reference"
WORKER_KEY = "worker"
MEASURING_KEY = "measuring"
DUPLICATE_KEY = "duplicate_of"
FAIL_REASON_KEY = "fail_reason"
SENSITIVITY_KEY = "sensitivity"
GUIDANCE_KEY = "guidance"
FORBIDDEN_KEY = "forbidden_choices"
WORKER = f"{socket.gethostname()}:{os.getpid()}"
"""This process, as the ``worker`` attr of the trials it runs names it."""
# Attrs of a trial that say who ran it, not what it measured: a duplicate copies none of them.
_RUN_KEYS = (WORKER_KEY, REFERENCE_KEY, MEASURING_KEY)


def share_records(
    study: optuna.Study,
    *,
    space: SearchSpace,
    fingerprint: str,
    targets: Targets,
    node_modules: Mapping[str, str] | None = None,
) -> SearchSpace:
    """Check ``study``'s records against a worker's, then store those it lacks; the study's space.

    Call it under the study lock. Everything is checked before anything is written. The stored
    space wins: a fine_tune study's space is narrowed around a best trial that a worker joining
    it cannot find again.

    Raises:
        ValueError: If the study was made for another model, targets or search space.
    """
    attrs = study.user_attrs
    own: dict[str, Any] = {MODEL_KEY: fingerprint, TARGETS_KEY: targets.to_dict()}
    for key, value in own.items():
        if key in attrs and attrs[key] != value:
            raise ValueError(
                f"Study {study.study_name!r} was made with another {key.replace('_', ' ')} "
                f"({attrs[key]!r}, here {value!r}); use another study name or cold_start."
            )
    stored = SearchSpace.from_dict(attrs[SPACE_KEY]) if SPACE_KEY in attrs else space
    theirs, ours = stored.distributions(), space.distributions()
    if theirs != ours:
        differing = sorted(name for name in theirs.keys() | ours.keys() if theirs.get(name) != ours.get(name))
        raise ValueError(
            f"Study {study.study_name!r} was made with another search space: parameter(s) {differing} "
            "differ; give the study's scopes and nodes, or use another study name or cold_start."
        )
    own[SPACE_KEY] = stored.to_dict()
    if node_modules:
        own[MODULES_KEY] = dict(node_modules)
    for key, value in own.items():
        if key not in attrs:
            study.set_user_attr(key, value)
    return stored


def stored_space(study: optuna.Study) -> SearchSpace:
    """The search space stored with ``study``.

    Raises:
        ValueError: If the study holds none, as a study made outside optuna-quant does not.
    """
    stored = study.user_attrs.get(SPACE_KEY)
    if stored is None:
        raise ValueError(
            f"Study {study.study_name!r} holds no optuna-quant search space (user attr {SPACE_KEY!r}); "
            "it was not made by optuna_quant.create_study."
        )
    return SearchSpace.from_dict(stored)


def node_modules(study: optuna.Study) -> dict[str, str]:
    """For a study of a ``torch.nn.Module``: the module name of each tunable ONNX node."""
    return dict(study.user_attrs.get(MODULES_KEY, {}))


def reference_scaling(study: optuna.Study) -> tuple[float, LossScaling] | None:
    """The fp32 accuracy and the loss scaling stored by the reference, or ``None`` before it."""
    attrs = study.user_attrs
    if SCALING_KEY not in attrs:
        return None
    return attrs[FP32_ACCURACY_KEY], LossScaling.from_dict(attrs[SCALING_KEY])


def store_reference(study: optuna.Study, fp32_accuracy: float, fp32_latency_ms: float, scaling: LossScaling) -> None:
    """Store what the reference measured, unless a reference stored it already (call under the lock).

    The scaling is written last: it is what other readers look for.
    """
    if SCALING_KEY in study.user_attrs:
        return
    study.set_user_attr(FP32_ACCURACY_KEY, fp32_accuracy)
    study.set_user_attr(FP32_LATENCY_KEY, fp32_latency_ms)
    study.set_user_attr(SCALING_KEY, scaling.to_dict())


def store_guidance(study: optuna.Study, sensitivity: Mapping[str, Mapping[str, Any]], guidance: Mapping[str, Any]) -> None:
    """Store what the study measured once after its reference (:mod:`optuna_quant.trial.guidance`).

    ``sensitivity`` (per layer, with ``acc_cost`` and ``time_saved_ms``) is what the dashboard's
    sensitivity chart and the probe read; ``guidance`` is the rest that the samplers' prior needs.
    """
    study.set_user_attr(SENSITIVITY_KEY, dict(sensitivity))
    study.set_user_attr(GUIDANCE_KEY, dict(guidance))


def stored_guidance(study: optuna.Study) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The sensitivity and guidance stored by :func:`store_guidance`, or ``None``."""
    attrs = study.user_attrs
    if SENSITIVITY_KEY not in attrs or GUIDANCE_KEY not in attrs:
        return None
    return attrs[SENSITIVITY_KEY], attrs[GUIDANCE_KEY]


def is_reference(trial: FrozenTrial | optuna.Trial) -> bool:
    """Whether ``trial`` measures the reference (the space's default configuration)."""
    return bool(trial.user_attrs.get(REFERENCE_KEY))


def unmark_reference(trial: optuna.Trial) -> None:
    """Make a queued reference trial an ordinary one: the reference was measured meanwhile."""
    trial.set_user_attr(REFERENCE_KEY, False)


def enqueue_reference(study: optuna.Study, params: dict[str, Any]) -> None:
    """Queue the reference trial, which the next worker that asks for a trial pops."""
    study.enqueue_trial(params, user_attrs={REFERENCE_KEY: True})


def reference_trial(
    study: optuna.Study,
    params: dict[str, Any],
    distributions: dict[str, Any],
    values: list[float],
    attrs: dict[str, Any],
    constraints: dict[str, float],
) -> None:
    """Record a reference measured outside any trial (an objective used on a plain study)."""
    study.add_trial(
        optuna.trial.create_trial(
            params=params,
            distributions=distributions,
            values=values,
            user_attrs={**attrs, WORKER_KEY: WORKER, REFERENCE_KEY: True},
            constraints=constraints,
        )
    )


def start_trial(trial: optuna.Trial) -> None:
    """Name this process as the worker of ``trial`` (a retried trial names the dead one)."""
    trial.set_user_attr(WORKER_KEY, WORKER)


def claim(trial: optuna.Trial) -> None:
    """Mark ``trial`` as measuring its configuration (call under the study lock)."""
    trial.set_user_attr(MEASURING_KEY, trial.number)


def is_measuring(trial: FrozenTrial) -> bool:
    """Whether ``trial`` claimed its configuration; a retry's copied claim names another number."""
    return trial.user_attrs.get(MEASURING_KEY) == trial.number


def measured(trial: FrozenTrial) -> bool:
    """Whether ``trial`` holds a measurement of its own or a copied one."""
    return "acc_loss" in trial.user_attrs


def record_result(trial: optuna.Trial, attrs: Mapping[str, Any], constraints: Mapping[str, float]) -> None:
    """Record a measurement (its user attrs and its target constraints) on ``trial``."""
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    for key, value in constraints.items():
        trial.set_constraint(key, value)


def copy_result(trial: optuna.Trial, previous: FrozenTrial) -> None:
    """Record on ``trial`` the result of ``previous``, which measured the same configuration."""
    record_result(
        trial,
        {**{k: v for k, v in previous.user_attrs.items() if k not in _RUN_KEYS}, DUPLICATE_KEY: previous.number},
        previous.constraints,
    )


def record_failure(trial: optuna.Trial, err: BaseException) -> None:
    """Keep why ``trial`` failed where the dashboard shows it: Optuna records no reason."""
    trial.set_user_attr(FAIL_REASON_KEY, f"{type(err).__name__}: {err}")


@dataclass(frozen=True)
class ForbiddenChoice:
    """A choice that fails on this model whatever the rest of the configuration, so the study
    no longer draws it (:mod:`optuna_quant.trial.failures`).

    Attributes:
        param: The parameter.
        choice: Its failing value.
        reason: The failure, ``"<exception type>: <message>"``.
        trial: The trial whose failure found it; ``None`` when the sensitivity measurement did.
    """

    param: str
    choice: Any
    reason: str
    trial: int | None = None

    def __str__(self) -> str:
        return f"{self.param}={self.choice!r}"


def forbid_choice(study: optuna.Study, forbidden: ForbiddenChoice) -> bool:
    """Store ``forbidden`` unless the study knows that choice already (call under the study lock).

    Returns:
        Whether it was new.
    """
    known = study.user_attrs.get(FORBIDDEN_KEY, [])
    if any(entry["param"] == forbidden.param and entry["choice"] == forbidden.choice for entry in known):
        return False
    study.set_user_attr(FORBIDDEN_KEY, [*known, asdict(forbidden)])
    return True


def forbidden_choices(study: optuna.Study) -> list[ForbiddenChoice]:
    """The choices :func:`forbid_choice` stored, in the order they were found."""
    return [ForbiddenChoice(**entry) for entry in study.user_attrs.get(FORBIDDEN_KEY, [])]
