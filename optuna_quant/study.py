"""``create_study``: a quantization study on Optuna, with POT's options and best-result rule.

Example:
    >>> import optuna_quant as oq
    >>> study = oq.create_study(model="model.onnx", calibration_data=calib,   # doctest: +SKIP
    ...                         eval_fn=evaluate, accuracy_loss=1.0, latency_reduce=1.5)
    >>> study.optimize(n_trials=100)                                         # doctest: +SKIP
    >>> study.best_result.summary()                                          # doctest: +SKIP
    'Best trial 41: acc_loss: 0.0063 lat_diff: 2.4468 (targets met)'
    >>> study.export_best("model.int8.onnx")                                 # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
import logging
from pathlib import Path
from typing import Any

import onnx
import optuna
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState

from optuna_quant.evaluate import EvalFn
from optuna_quant.evaluate import Top1Accuracy
from optuna_quant.latency import BenchmarkSettings
from optuna_quant.loss import Targets
from optuna_quant.model_io import ModelLike
from optuna_quant.objective import QuantizationObjective
from optuna_quant.objective import SPACE_KEY
from optuna_quant.results import best_trial
from optuna_quant.results import BestResult
from optuna_quant.samplers.factory import make_sampler
from optuna_quant.space import SCOPES
from optuna_quant.space import SearchSpace
from optuna_quant.stopping import StopOnTarget

_logger = logging.getLogger("optuna_quant")

DEFAULT_STORAGE = "sqlite:///optuna_quant.db"
TRIALS_LOAD_METHODS = ("cold_start", "warm_start", "fine_tune", "eval")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
FINE_TUNE_SUFFIX = "-fine_tune"


class QuantStudy:
    """A quantization study: the plain :class:`optuna.Study` plus the objective that feeds it.

    Attributes of the Optuna study (``trials``, ``best_trial``, ``user_attrs``...) are reachable
    directly on this object, and the study itself as :attr:`study`, so every Optuna tool works on it.

    Args:
        study: The Optuna study.
        objective: The quantization objective.
        stop_on_target: Stop every worker once a trial meets both targets.
        run_trials: ``False`` for ``trials_load_method="eval"``, where ``optimize`` runs nothing.
    """

    def __init__(
        self,
        study: optuna.Study,
        objective: QuantizationObjective,
        stop_on_target: bool = False,
        run_trials: bool = True,
    ) -> None:
        self.study = study
        self.objective = objective
        self.stop_on_target = stop_on_target
        self.run_trials = run_trials

    def __getattr__(self, name: str) -> Any:
        return getattr(self.study, name)

    @property
    def targets(self) -> Targets:
        """The accuracy and latency targets."""
        return self.objective.targets

    def optimize(
        self,
        n_trials: int | None = None,
        timeout: float | None = None,
        show_progress_bar: bool = False,
        callbacks: Iterable[Any] = (),
    ) -> BestResult | None:
        """Run trials until the study holds ``n_trials`` finished ones (POT's ``max_trials``).

        Under ``warm_start`` the earlier trials count towards ``n_trials``. A trial that fails is
        recorded as failed with its reason and the run goes on.

        Args:
            n_trials: Total finished trials wanted in the study; ``None`` runs until ``timeout``.
            timeout: Seconds (POT's ``max_minutes * 60``); the running trial is completed.
            show_progress_bar: Show Optuna's progress bar.
            callbacks: More ``optimize`` callbacks.

        Returns:
            The best result, or ``None`` when no trial completed.
        """
        if n_trials is None and timeout is None:
            raise ValueError("Give n_trials (max_trials) or timeout (max_minutes), or both.")
        if self.run_trials:
            self.objective.max_trials = n_trials
            self.objective.prepare(self.study)
            remaining = None
            all_callbacks = list(callbacks)
            if n_trials is not None:
                remaining = n_trials - len(self.study.get_trials(deepcopy=False, states=FINISHED))
                all_callbacks.append(MaxTrialsCallback(n_trials, states=FINISHED))
            if self.stop_on_target:
                all_callbacks.append(StopOnTarget(self.targets))
            if remaining is None or remaining > 0:
                self.study.optimize(
                    self.objective,
                    n_trials=remaining,
                    timeout=timeout,
                    catch=(Exception,),
                    callbacks=all_callbacks,
                    show_progress_bar=show_progress_bar,
                )
        best = self.best_result
        if best is not None:
            _logger.info(best.summary())
        return best

    @property
    def best_result(self) -> BestResult | None:
        """The best trial by POT's rule: within the accuracy target, the fastest; else lowest loss."""
        trial = best_trial(self.study.get_trials(deepcopy=False), self.targets)
        return None if trial is None else BestResult.from_trial(trial, self.targets)

    def best_model(self) -> onnx.ModelProto:
        """The int8 model of the best trial, rebuilt from cached calibration.

        Raises:
            RuntimeError: If no trial has completed.
        """
        best = self.best_result
        if best is None:
            raise RuntimeError(f"Study {self.study.study_name!r} has no completed trial to export.")
        return self.objective.quantizer.quantize(self.objective.space.to_config(best.params))

    def export_best(self, path: str | Path) -> BestResult:
        """Write the best int8 model to ``path``; a run that missed a target still exports its best."""
        model = self.best_model()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(path))
        best = self.best_result
        assert best is not None  # best_model() raised otherwise
        if best.missed:
            _logger.warning("Exported the best model, which misses the %s target.", " and ".join(best.missed))
        return best


def create_study(
    model: ModelLike | Any,
    calibration_data: Iterable[Any],
    eval_fn: EvalFn | None = None,
    *,
    eval_data: tuple[Any, Any] | None = None,
    accuracy_loss: float = 1.0,
    latency_reduce: float = 1.0,
    accuracy_weight: float = 1.0,
    latency_weight: float = 1.0,
    sampler: str | optuna.samplers.BaseSampler = "tpe",
    seed: int | None = None,
    storage: str | optuna.storages.BaseStorage | None = None,
    study_name: str = "optuna-quant",
    trials_load_method: str = "cold_start",
    stop_on_target: bool = False,
    scopes: Iterable[str] = SCOPES,
    nodes: Iterable[str] | None = None,
    benchmark: BenchmarkSettings | dict[str, Any] | None = None,
    metrics: float | None = None,
    eval_subset_size: int | None = None,
    example_inputs: Any = None,
) -> QuantStudy:
    """Create (or load) a study that tunes int8 quantization of ``model``.

    Args:
        model: An ONNX path or ``onnx.ModelProto``; or a ``torch.nn.Module`` with
            ``example_inputs``.
        calibration_data: Iterable of ``{input_name: array}`` (or arrays, single input).
        eval_fn: ``eval_fn(session) -> float``, higher is better. Give this or ``eval_data``.
        eval_data: ``(inputs, labels)`` scored by top-1 accuracy (:class:`Top1Accuracy`).
        accuracy_loss: Largest relative accuracy loss, in percent.
        latency_reduce: Wanted ``fp32_latency / int8_latency``.
        accuracy_weight: Weight of the accuracy term of POT's loss.
        latency_weight: Weight of the latency term of POT's loss.
        sampler: ``"tpe"`` (default), ``"gp"``, ``"random"``, or any Optuna sampler.
        seed: Seed of a sampler given by name.
        storage: Any Optuna storage; default an SQLite file, ``optuna_quant.db``.
        study_name: The study's name in the storage.
        trials_load_method: ``cold_start``, ``warm_start``, ``fine_tune`` or ``eval`` (POT's).
        stop_on_target: Stop every worker once a trial meets both targets.
        scopes: The tuning scopes that vary: ``layer``, ``range_estimator``, ``granularity``,
            ``mode``. Under ``fine_tune``, the scopes that vary around the previous best.
        nodes: Restrict the ``layer`` scope to these node names.
        benchmark: Latency settings (:class:`BenchmarkSettings` or its fields as a dict).
        metrics: The fp32 accuracy, when known: skips the fp32 evaluation.
        eval_subset_size: Evaluate every model on the first N samples only.
        example_inputs: Example inputs of a ``torch.nn.Module`` model.

    Returns:
        The :class:`QuantStudy`.

    Raises:
        ValueError, TypeError, FileNotFoundError: For bad input, before any trial runs.
    """
    if trials_load_method not in TRIALS_LOAD_METHODS:
        raise ValueError(
            f"Unknown trials_load_method {trials_load_method!r}; choose from {TRIALS_LOAD_METHODS}."
        )
    targets = Targets(accuracy_loss, latency_reduce, accuracy_weight, latency_weight)
    if (eval_fn is None) == (eval_data is None):
        raise ValueError("Give exactly one of eval_fn and eval_data.")
    if eval_data is not None:
        eval_fn = Top1Accuracy(*eval_data)
    if isinstance(benchmark, dict):
        benchmark = BenchmarkSettings.from_dict(benchmark)
    sampler_obj = make_sampler(sampler, seed)
    if not isinstance(model, (str, Path, onnx.ModelProto)):
        from optuna_quant.torch_export import export_module

        model, _ = export_module(model, example_inputs)
    storage = DEFAULT_STORAGE if storage is None else storage
    scopes = tuple(scopes)

    space = None
    name = study_name
    if trials_load_method == "fine_tune":
        previous = _load_or_none(study_name, storage)
        if previous is None:
            _logger.info("No study %r to fine-tune: starting with cold_start.", study_name)
            trials_load_method = "cold_start"
        else:
            space = _narrowed_space(previous, scopes, targets)
            name = study_name + FINE_TUNE_SUFFIX
    objective = QuantizationObjective(
        model,
        calibration_data,
        eval_fn,
        targets=targets,
        scopes=scopes,
        nodes=nodes,
        space=space,
        benchmark=benchmark,
        fp32_accuracy=metrics,
        eval_subset_size=eval_subset_size,
        stop_on_target=stop_on_target,
    )
    if trials_load_method == "eval":
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler_obj)
        objective.space = SearchSpace.from_dict(study.user_attrs[SPACE_KEY])
        return QuantStudy(study, objective, stop_on_target, run_trials=False)
    if trials_load_method == "warm_start":
        if _load_or_none(name, storage) is None:
            _logger.info("No study %r to warm-start: starting with cold_start.", name)
    elif _load_or_none(name, storage) is not None:
        _logger.info("cold_start: deleting the existing study %r.", name)
        optuna.delete_study(study_name=name, storage=storage)
    study = optuna.create_study(
        study_name=name, storage=storage, sampler=sampler_obj, direction="minimize", load_if_exists=True
    )
    _ensure_log_handler()
    return QuantStudy(study, objective, stop_on_target)


def _load_or_none(study_name: str, storage: str | optuna.storages.BaseStorage) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return None


def _narrowed_space(previous: optuna.Study, scopes: tuple[str, ...], targets: Targets) -> SearchSpace:
    space = SearchSpace.from_dict(previous.user_attrs[SPACE_KEY])
    best = best_trial(previous.get_trials(deepcopy=False), targets)
    if best is None:
        raise ValueError(f"Study {previous.study_name!r} has no completed trial to fine-tune around.")
    _logger.info("fine_tune: narrowing to %s around trial %d.", sorted(scopes), best.number)
    return space.narrow(space.to_config(best.params), scopes)


def _ensure_log_handler() -> None:
    # POT users read the log lines, so show them when the application configured no logging.
    if not logging.getLogger().handlers and not _logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
        _logger.addHandler(handler)
        _logger.setLevel(logging.INFO)
