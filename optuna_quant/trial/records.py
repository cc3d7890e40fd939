"""The schema of what optuna-quant stores: every key, with the functions that write and read it.

Study user attrs, written when the study is made (:func:`share_records`) or by its reference
trial, then only read: the search space, the targets, the model's fingerprint, the node-to-module
map of a torch model, the fp32 accuracy and latency, the loss scaling of the reference, the
per-layer sensitivity measured after it (:mod:`optuna_quant.trial.guidance`), and the choices
learnt to fail (:class:`ForbiddenChoice`, :mod:`optuna_quant.trial.failures`). Trial user attrs:
the measurement (``acc_loss``, ``lat_diff``...), its loss, the worker that ran the trial, the
reference flag, the trial a duplicate copied and the reason of a failure. No other module names a
key: the rest of the package reads the records through the readers here.

A stored space equals another when their Optuna distributions are equal (the same parameters with
the same choices): that one rule decides whether a worker may join a study. Writes that depend on
what is read (:func:`share_records`, :func:`store_reference`) run under the study lock.

Example:
    >>> import optuna
    >>> from optuna_quant.measure.loss import Targets
    >>> from optuna_quant.trial.space import SearchSpace
    >>> study = optuna.create_study()
    >>> space = SearchSpace(nodes=("conv",), scopes=frozenset({"layer"}))
    >>> share_records(study, space=space, fingerprint="abc", targets=Targets(), int8_class="x86-vnni") == space
    True
    >>> share_records(study, space=space, fingerprint="other", targets=Targets(), int8_class="x86-vnni")
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

from optuna_quant._optuna_private import set_trial_attrs
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
PRUNED_KEY = "pruned"
SENSITIVITY_KEY = "sensitivity"
GUIDANCE_KEY = "guidance"
FORBIDDEN_KEY = "forbidden_choices"
INT8_CLASS_KEY = "int8_class"
ONNXRUNTIME_KEY = "onnxruntime"
RECIPE_KEY = "recipe"
RECIPES_KEY = "recipes"
SENSITIVITY_PLAN_KEY = "sensitivity_plan"
# The measurement's keys: :meth:`optuna_quant.measure.measurer.Measurement.user_attrs` writes
# them, in a layer below this one; the objective adds the loss.
ACC_LOSS_KEY = "acc_loss"
LAT_DIFF_KEY = "lat_diff"
QUANTIZED_KEY = "quantized"
ACCURACY_KEY = "accuracy"
QUANTIZE_SECONDS_KEY = "quantize_s"
EVAL_SECONDS_KEY = "eval_s"
LATENCY_SECONDS_KEY = "latency_s"
LOSS_KEY = "loss"
WORKER = f"{socket.gethostname()}:{os.getpid()}"
"""This process, as the ``worker`` attr of the trials it runs names it."""
# Attrs of a trial that say who ran it, not what it measured: a duplicate copies none of them.
_RUN_KEYS = (WORKER_KEY, REFERENCE_KEY, MEASURING_KEY, INT8_CLASS_KEY, ONNXRUNTIME_KEY, RECIPE_KEY)


def share_records(
    study: optuna.Study,
    *,
    space: SearchSpace,
    fingerprint: str,
    targets: Targets,
    int8_class: str,
    node_modules: Mapping[str, str] | None = None,
) -> SearchSpace:
    """Check ``study``'s records against a worker's, then store those it lacks; the study's space.

    Call it under the study lock. Everything is checked before anything is written. The stored
    space wins: a fine_tune study's space is narrowed around a best trial that a worker joining
    it cannot find again.

    Raises:
        ValueError: If the study was made for another model, targets, search space or CPU int8
            class (:func:`check_int8_class`).
    """
    check_int8_class(study, int8_class)
    attrs = study.user_attrs
    own: dict[str, Any] = {MODEL_KEY: fingerprint, TARGETS_KEY: targets.to_dict(), INT8_CLASS_KEY: int8_class}
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
            "differ; give the study's scopes, nodes and layer_groups, or use another study name or cold_start."
        )
    own[SPACE_KEY] = stored.to_dict()
    if node_modules:
        own[MODULES_KEY] = dict(node_modules)
    for key, value in own.items():
        if key not in attrs:
            study.set_user_attr(key, value)
    return stored


def check_int8_class(study: optuna.Study, int8_class: str) -> None:
    """Refuse a worker whose CPU is of another int8 class than the one ``study`` is tuned on.

    Latency, and the accuracy of an int8 model, differ between classes
    (:mod:`optuna_quant.measure.cpu`): mixed in one study, trials would not compare.

    Raises:
        ValueError: If the study records another class; it names both and what to do instead.
    """
    stored = stored_int8_class(study)
    if stored is not None and stored != int8_class:
        raise ValueError(
            f"Study {study.study_name!r} is tuned on CPUs of int8 class {stored!r}; this machine's is "
            f"{int8_class!r}, whose latency and int8 accuracy differ: its trials would not compare. Run "
            "this worker on a machine of that class, or tune this class in a study of its own (another "
            "study_name, or fine_tune around the stored best)."
        )


def stored_int8_class(study: optuna.Study) -> str | None:
    """The CPU int8 class ``study`` is tuned on (every trial's), or ``None`` before its first worker."""
    return study.user_attrs.get(INT8_CLASS_KEY)


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


def stored_targets(study: optuna.Study) -> Targets | None:
    """The targets stored with ``study`` when it was made; ``None`` if optuna-quant did not make it."""
    stored = study.user_attrs.get(TARGETS_KEY)
    return None if stored is None else Targets(**stored)


def node_modules(study: optuna.Study) -> dict[str, str]:
    """For a study of a ``torch.nn.Module``: the module name of each tunable ONNX node."""
    return dict(study.user_attrs.get(MODULES_KEY, {}))


def reference_scaling(study: optuna.Study) -> tuple[float, LossScaling] | None:
    """The fp32 accuracy and the loss scaling stored by the reference, or ``None`` before it."""
    attrs = study.user_attrs
    if SCALING_KEY not in attrs:
        return None
    return attrs[FP32_ACCURACY_KEY], LossScaling.from_dict(attrs[SCALING_KEY])


def stored_fp32_accuracy(study: optuna.Study) -> float | None:
    """The fp32 accuracy stored by the reference, or ``None`` before it."""
    return study.user_attrs.get(FP32_ACCURACY_KEY)


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


def stored_sensitivity(study: optuna.Study) -> dict[str, dict[str, Any]] | None:
    """The per-layer sensitivity stored by :func:`store_guidance`, or ``None``."""
    return study.user_attrs.get(SENSITIVITY_KEY)


def enqueue_recipes(study: optuna.Study, recipes: list[tuple[str, dict[str, Any]]]) -> None:
    """Queue the recipe trials (:mod:`optuna_quant.trial.recipes`) once per study (call under the lock)."""
    if RECIPES_KEY in study.user_attrs:
        return
    for name, params in recipes:
        study.enqueue_trial(params, user_attrs={RECIPE_KEY: name}, skip_if_exists=True)
    study.set_user_attr(RECIPES_KEY, [name for name, _ in recipes])


def recipe(trial: FrozenTrial) -> str | None:
    """The recipe that ``trial`` was queued as, or ``None``."""
    return trial.user_attrs.get(RECIPE_KEY)


def sensitivity_plan(study: optuna.Study) -> dict[str, Any] | None:
    """What the study decided to measure of its sensitivity (:func:`claim_sensitivity`), or ``None``."""
    return study.user_attrs.get(SENSITIVITY_PLAN_KEY)


def claim_sensitivity(study: optuna.Study) -> bool:
    """Make this worker the one that measures the study's sensitivity, unless one is (call under
    the lock); whether it is."""
    if study.user_attrs.get(SENSITIVITY_PLAN_KEY) is not None or stored_guidance(study) is not None:
        return False
    study.set_user_attr(SENSITIVITY_PLAN_KEY, {"worker": WORKER})
    return True


def store_sensitivity_plan(study: optuna.Study, plan: Mapping[str, Any] | None) -> None:
    """Record what the claiming worker measures; ``None`` releases the claim (an interrupted worker)."""
    study.set_user_attr(SENSITIVITY_PLAN_KEY, None if plan is None else {"worker": WORKER, **plan})


def sensitivity_seconds(study: optuna.Study) -> float:
    """What the study's sensitivity measurement took (0 before it, or without it)."""
    return float(study.user_attrs.get(GUIDANCE_KEY, {}).get("seconds", 0.0))


def seconds_spent(trial: FrozenTrial) -> tuple[float, float, float]:
    """The seconds that ``trial``'s own measurement spent quantizing, evaluating and timing;
    zeros for a trial that copied another's."""
    attrs = trial.user_attrs
    if DUPLICATE_KEY in attrs:
        return 0.0, 0.0, 0.0
    keys = (QUANTIZE_SECONDS_KEY, EVAL_SECONDS_KEY, LATENCY_SECONDS_KEY)
    quantize, evaluate, timing = (float(attrs.get(key, 0.0)) for key in keys)
    return quantize, evaluate, timing


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


def start_trial(trial: optuna.Trial, int8_class: str, onnxruntime_version: str) -> None:
    """Name this process as the worker of ``trial`` (a retried trial names the dead one), with
    its CPU's int8 class and its onnxruntime."""
    set_trial_attrs(trial, {WORKER_KEY: WORKER, INT8_CLASS_KEY: int8_class, ONNXRUNTIME_KEY: onnxruntime_version})


def provenance(trial: FrozenTrial) -> dict[str, Any]:
    """What an exported model of ``trial`` says of itself: the trial, what it measured, and the
    CPU int8 class and onnxruntime it was measured with (the figures hold for that class only)."""
    attrs = trial.user_attrs
    return {
        "study_trial": trial.number,
        ACC_LOSS_KEY: attrs.get(ACC_LOSS_KEY),
        LAT_DIFF_KEY: attrs.get(LAT_DIFF_KEY),
        INT8_CLASS_KEY: attrs.get(INT8_CLASS_KEY),
        ONNXRUNTIME_KEY: attrs.get(ONNXRUNTIME_KEY),
    }


def worker_int8_class(trial: FrozenTrial) -> str | None:
    """The CPU int8 class of the worker that ran ``trial`` (``None`` for a trial of optuna-quant 0.1)."""
    return trial.user_attrs.get(INT8_CLASS_KEY)


def claim(trial: optuna.Trial) -> None:
    """Mark ``trial`` as measuring its configuration (call under the study lock)."""
    trial.set_user_attr(MEASURING_KEY, trial.number)


def is_measuring(trial: FrozenTrial) -> bool:
    """Whether ``trial`` claimed its configuration; a retry's copied claim names another number."""
    return trial.user_attrs.get(MEASURING_KEY) == trial.number


def measured(trial: FrozenTrial) -> bool:
    """Whether ``trial`` holds a measurement of its own or a copied one."""
    return ACC_LOSS_KEY in trial.user_attrs


def acc_loss(trial: FrozenTrial) -> float:
    """The relative accuracy loss against fp32 of a :func:`measured` trial."""
    return trial.user_attrs[ACC_LOSS_KEY]


def lat_diff(trial: FrozenTrial) -> float:
    """The speed-up against fp32 (``fp32_latency / int8_latency``) of a :func:`measured` trial."""
    return trial.user_attrs[LAT_DIFF_KEY]


def quantized(trial: FrozenTrial) -> bool:
    """Whether a :func:`measured` trial's model runs anything in int8 (trials of earlier versions did)."""
    return bool(trial.user_attrs.get(QUANTIZED_KEY, True))


def int8_accuracy(trial: FrozenTrial) -> float | None:
    """The int8 model's score from ``eval_fn`` that ``trial`` recorded, or ``None``."""
    return trial.user_attrs.get(ACCURACY_KEY)


def loss(trial: FrozenTrial) -> float | None:
    """POT's loss that ``trial`` recorded beside its value(s), or ``None``."""
    return trial.user_attrs.get(LOSS_KEY)


def record_result(trial: optuna.Trial, attrs: Mapping[str, Any], constraints: Mapping[str, float]) -> None:
    """Record a measurement (its user attrs and its target constraints) on ``trial``, in one write
    where the storage allows it."""
    set_trial_attrs(trial, attrs, constraints)


def copy_result(trial: optuna.Trial, previous: FrozenTrial) -> None:
    """Record on ``trial`` the result of ``previous``, which measured the same configuration."""
    record_result(
        trial,
        {**{k: v for k, v in previous.user_attrs.items() if k not in _RUN_KEYS}, DUPLICATE_KEY: previous.number},
        previous.constraints,
    )


def record_pruned(trial: optuna.Trial, reason: str) -> None:
    """Keep why ``trial``'s timing was stopped beside what it measured."""
    trial.set_user_attr(PRUNED_KEY, reason)


def record_failure(trial: optuna.Trial, err: BaseException) -> None:
    """Keep why ``trial`` failed where the dashboard shows it: Optuna records no reason."""
    trial.set_user_attr(FAIL_REASON_KEY, f"{type(err).__name__}: {err}")


@dataclass(frozen=True)
class ForbiddenChoice:
    """A choice that fails on this model whatever the rest of the configuration, or together with
    other choices, so the study no longer draws it (with them) (:mod:`optuna_quant.trial.failures`).

    Attributes:
        param: The parameter.
        choice: Its failing value.
        reason: The failure, ``"<exception type>: <message>"``.
        trial: The trial whose failure found it; ``None`` when the sensitivity measurement did.
        together: The other ``(param, choice)`` pairs without which the choice does not fail;
            none: it fails alone.
    """

    param: str
    choice: Any
    reason: str
    trial: int | None = None
    together: tuple[tuple[str, Any], ...] = ()

    @property
    def choices(self) -> dict[str, Any]:
        """Every choice that fails together, by parameter."""
        return {self.param: self.choice, **dict(self.together)}

    def held_by(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` hold every choice that fails together."""
        return all(name in params and params[name] == choice for name, choice in self.choices.items())

    def __str__(self) -> str:
        return " with ".join(f"{name}={choice!r}" for name, choice in self.choices.items())


def forbid_choice(study: optuna.Study, forbidden: ForbiddenChoice) -> bool:
    """Store ``forbidden`` unless the study knows those choices already (call under the study lock).

    Returns:
        Whether it was new.
    """
    known = study.user_attrs.get(FORBIDDEN_KEY, [])
    if any(_from_record(entry).choices == forbidden.choices for entry in known):
        return False
    study.set_user_attr(FORBIDDEN_KEY, [*known, asdict(forbidden)])
    return True


def forbidden_choices(study: optuna.Study) -> list[ForbiddenChoice]:
    """The choices :func:`forbid_choice` stored, in the order they were found."""
    return [_from_record(entry) for entry in study.user_attrs.get(FORBIDDEN_KEY, [])]


def _from_record(entry: Mapping[str, Any]) -> ForbiddenChoice:
    # JSON storage turns the pairs of ``together`` into lists; records of earlier versions lack it.
    together = tuple((name, choice) for name, choice in entry.get("together", ()))
    return ForbiddenChoice(**{**entry, "together": together})
