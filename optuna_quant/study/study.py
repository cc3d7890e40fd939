"""``create_study``: a quantization study on Optuna, with POT's options; :class:`QuantStudy` runs
it, reports its best trial and exports that trial's int8 model.

Example:
    >>> import optuna_quant as oq
    >>> study = oq.create_study(model="model.onnx", calibration_data=calib,   # doctest: +SKIP
    ...                         eval_fn=evaluate, accuracy_loss=1.0, latency_reduce=1.5)
    >>> study.optimize(n_trials=100)                                         # doctest: +SKIP
    >>> study.best_result.summary()                                          # doctest: +SKIP
    'Best trial 41: acc_loss: 0.0063 lat_diff: 2.4468 (targets met)'
    >>> study.export_best("model.int8.onnx")                                 # doctest: +SKIP

Several workers (processes or machines) share a study through a database URL: each runs the same
``create_study(..., storage="postgresql://...", trials_load_method="warm_start")`` and
``optimize(n_trials)``; together they run ``n_trials`` trials (see :mod:`optuna_quant.study.worker`).
The load methods are :mod:`optuna_quant.study.load_methods`, the stored records
:mod:`optuna_quant.trial.records`.
"""

from __future__ import annotations

from collections.abc import Iterable
import logging
from pathlib import Path
from typing import Any

import onnx
import optuna

from optuna_quant import logs
from optuna_quant._optuna_private import TRIAL_LINE_LOGGERS
from optuna_quant.trial import records
from optuna_quant.storages.artifacts import check_writable
from optuna_quant.storages.artifacts import upload_model
from optuna_quant.visualization.dashboard import DashboardFigures
from optuna_quant.measure.cpu import int8_support
from optuna_quant.measure.evaluate import EvalFn
from optuna_quant.measure.evaluate import eval_function
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.study.load_methods import FINE_TUNE_SUFFIX
from optuna_quant.study.load_methods import open_study
from optuna_quant.study.load_methods import plan_load
from optuna_quant.study.load_methods import TRIALS_LOAD_METHODS
from optuna_quant.measure.loss import Targets
from optuna_quant.quantization.model_io import ModelLike
from optuna_quant.trial.objective import OBJECTIVE_MODES
from optuna_quant.trial.objective import QuantizationObjective
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.results import BestResult
from optuna_quant.samplers.factory import make_sampler
from optuna_quant.trial.space import LAYER_PREFIX
from optuna_quant.trial.space import SCOPES
from optuna_quant.storages.factory import open_storage
from optuna_quant.storages.heartbeat import GRACE_PERIOD
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.heartbeat import HEARTBEAT_INTERVAL
from optuna_quant.storages.lock import in_memory
from optuna_quant.storages.lock import study_lock
from optuna_quant.storages.lock import StudyLock
from optuna_quant.storages.rdb import default_artifact_dir
from optuna_quant.storages.rdb import optuna_warnings_off
from optuna_quant.study.worker import Worker

__all__ = ["FINE_TUNE_SUFFIX", "QuantStudy", "TRIALS_LOAD_METHODS", "create_study"]

_logger = logging.getLogger("optuna_quant")

METRIC_NAMES = {"loss": ["loss"], "pareto": ["acc_loss", "lat_diff"]}


class QuantStudy:
    """A quantization study: the plain :class:`optuna.Study` plus the objective that feeds it.

    Attributes of the Optuna study (``trials``, ``best_trial``, ``user_attrs``...) are reachable
    directly on this object, and the study itself as :attr:`study`, so every Optuna tool works on it.

    Args:
        study: The Optuna study.
        objective: The quantization objective.
        storage: The storage the study was opened on.
        artifact_dir: Folder of the artifact store that receives the best model.
        run_trials: ``False`` for ``trials_load_method="eval"``, where ``optimize`` runs nothing.

    Attributes:
        figures: The callback that stores the study's figures for optuna-dashboard after every
            trial of :meth:`optimize`; its ``seconds`` tell what that cost.
    """

    def __init__(
        self,
        study: optuna.Study,
        objective: QuantizationObjective,
        storage: optuna.storages.BaseStorage,
        artifact_dir: str | Path,
        run_trials: bool = True,
    ) -> None:
        self.study = study
        self.objective = objective
        self.storage = storage
        self.artifact_dir = Path(artifact_dir)
        self.run_trials = run_trials
        # The last best model built: the artifact upload, export_best and best_model want the
        # same one, and each build deep-copies and rewrites the whole model.
        self._built: tuple[int, onnx.ModelProto] | None = None
        self.figures = DashboardFigures()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.study, name)

    @property
    def targets(self) -> Targets:
        """The accuracy and latency targets."""
        return self.objective.targets

    @property
    def stop_on_target(self) -> bool:
        """Whether every worker stops once a trial meets both targets (the objective's setting)."""
        return self.objective.settings.stop_on_target

    @property
    def lock(self) -> StudyLock:
        """The lock that every worker of this study shares."""
        return self.objective.lock

    @property
    def heartbeat(self) -> Heartbeat | None:
        """This worker's heartbeat; ``None`` for a storage that no other process can open."""
        return self.objective.heartbeat

    def optimize(
        self,
        n_trials: int | None = None,
        timeout: float | None = None,
        show_progress_bar: bool = False,
        callbacks: Iterable[Any] = (),
    ) -> BestResult | None:
        """Run trials until the study holds ``n_trials`` of them (POT's ``max_trials``).

        ``n_trials`` is the study's total, shared by every worker and counting the reference:
        under ``warm_start`` the earlier trials count, and workers on one storage stop together
        at ``n_trials``. A trial that fails is recorded as failed with its reason and the run goes
        on; a trial whose worker died is failed by the heartbeat and run again by another
        worker (see :mod:`optuna_quant.study.worker`). At the end the best model is stored as an
        artifact of the study.

        Args:
            n_trials: Total trials wanted in the study; ``None`` runs until ``timeout``.
            timeout: Seconds (POT's ``max_minutes * 60``) after which no trial starts.
            show_progress_bar: Show trial k of N, the best result so far and the time left.
            callbacks: More ``optimize`` callbacks, called after each trial.

        Returns:
            The best result, or ``None`` when no trial completed.

        Raises:
            ValueError: If neither ``n_trials`` nor ``timeout`` is a positive number.
            optuna_quant.storages.artifacts.NotWritableError: If the artifact folder cannot be written,
                before any trial.
            optuna_quant.trial.reference.ReferenceMeasurementError: If ``eval_fn`` fails on the reference.

        Example:
            >>> best = study.optimize(n_trials=100, timeout=3600)   # doctest: +SKIP
        """
        if n_trials is None and timeout is None:
            raise ValueError("Give n_trials (max_trials) or timeout (max_minutes), or both.")
        if n_trials is not None and (isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1):
            raise ValueError(f"n_trials (max_trials) must be a positive integer, got {n_trials!r}.")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout (max_minutes) must be positive, got {timeout!r}.")
        with logs.quiet_onnxruntime():
            if self.run_trials:
                check_writable(self.artifact_dir, "artifact_dir", folder=True)
                Worker(
                    self.study,
                    self.storage,
                    self.objective,
                    self.lock,
                    self.heartbeat,
                    n_trials,
                    timeout=timeout,
                    callbacks=[self.figures, *callbacks],
                    show_progress_bar=show_progress_bar,
                ).run()
            best = self.best_result
            if best is not None:
                _logger.info(best.summary())
                if self.run_trials:
                    upload_model(self.study, self.artifact_dir, self.lock, best.number, lambda: self._model_of(best))
        return best

    @property
    def best_result(self) -> BestResult | None:
        """The best trial (:func:`optuna_quant.trial.results.best_trial`), or ``None`` before any.

        Among the trials within the accuracy target, the highest ``lat_diff`` (ties: the lower
        ``acc_loss``), as POT; when none is within it, the lowest ``acc_loss`` among the trials at
        least as fast as fp32 (among all when none is).
        """
        trial = best_trial(self.study.get_trials(deepcopy=False), self.targets)
        return None if trial is None else BestResult.from_trial(trial, self.targets)

    @property
    def node_modules(self) -> dict[str, str]:
        """For a study of a ``torch.nn.Module``: the module name of each tunable ONNX node."""
        return records.node_modules(self.study)

    def fallback_modules(self, best: BestResult | None = None) -> list[str]:
        """The layers that the best trial keeps in fp32, by module name where one is known.

        Args:
            best: The best result when the caller has it, as :meth:`optimize` returns it;
                otherwise it is read from the study.
        """
        best = self.best_result if best is None else best
        if best is None:
            return []
        names = self.node_modules
        return [
            names.get(node, node)
            for node in sorted(self.objective.space.to_config(best.params).fallback)
        ]

    def best_model(self) -> onnx.ModelProto:
        """The int8 model of the best trial, rebuilt from cached calibration.

        It is built once per best trial and shared with :meth:`export_best`: copy it before
        changing it.

        Raises:
            RuntimeError: If no trial has completed.
        """
        return self._model_of(self._require_best())

    def _require_best(self) -> BestResult:
        best = self.best_result
        if best is None:
            raise RuntimeError(f"Study {self.study.study_name!r} has no completed trial to export.")
        return best

    def _model_of(self, best: BestResult) -> onnx.ModelProto:
        if self._built is None or self._built[0] != best.number:
            model = self.objective.build(best.params)
            trial = self.study.get_trials(deepcopy=False)[best.number]
            props = {prop.key: prop.value for prop in model.metadata_props}
            props.update({f"optuna_quant.{key}": str(value) for key, value in records.provenance(trial).items()})
            onnx.helper.set_model_props(model, props)
            self._built = (best.number, model)
        return self._built[1]

    def export_best(self, path: str | Path, best: BestResult | None = None) -> BestResult:
        """Write the best int8 model to ``path``; a run that missed a target still exports its best.

        The model is also stored as an artifact of the study (see :mod:`optuna_quant.storages.artifacts`).

        Args:
            path: Where to write the model.
            best: The best result when the caller has it, as :meth:`optimize` returns it;
                otherwise it is read from the study.

        Raises:
            optuna_quant.storages.artifacts.NotWritableError: If ``path`` or the artifact folder cannot be
                written, before the model is built.
            RuntimeError: If no trial has completed.
        """
        path = Path(path)
        check_writable(path, "export path")
        check_writable(self.artifact_dir, "artifact_dir", folder=True)
        if best is None:
            best = self._require_best()
        with logs.quiet_onnxruntime():
            model = self._model_of(best)
            path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(model, str(path))
            upload_model(self.study, self.artifact_dir, self.lock, best.number, lambda: model)
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
    objective_mode: str = "loss",
    artifact_dir: str | Path | None = None,
    heartbeat_interval: int = HEARTBEAT_INTERVAL,
    grace_period: int = GRACE_PERIOD,
    pre_process: bool | str = True,
    sensitivity: bool = True,
    latency_data: Any = None,
    layer_groups: str | None = None,
) -> QuantStudy:
    """Create (or load) a study that tunes int8 quantization of ``model``.

    Args:
        model: An ONNX path or ``onnx.ModelProto``; or a ``torch.nn.Module`` with
            ``example_inputs``.
        calibration_data: Iterable of ``{input_name: array}`` (or arrays, single input).
        eval_fn: ``eval_fn(session) -> float``, higher is better. Give this or ``eval_data``.
        eval_data: ``(inputs, labels)`` scored by top-1 accuracy
            (:class:`~optuna_quant.measure.evaluate.Top1Accuracy`).
        accuracy_loss: Largest relative accuracy loss, in percent.
        latency_reduce: Wanted ``fp32_latency / int8_latency``.
        accuracy_weight: Weight of the accuracy term of POT's loss.
        latency_weight: Weight of the latency term of POT's loss.
        sampler: ``"tpe"`` (default), ``"gp"``, ``"random"``, or any Optuna sampler.
        seed: Seed of a sampler given by name.
        storage: A storage URL or Optuna storage object; default an SQLite file,
            ``optuna_quant.db``. PostgreSQL, MySQL/MariaDB, a journal file on a shared file system
            (``journal:PATH``) or Optuna's gRPC proxy (``grpc://HOST:PORT``) let workers on many
            machines share it (:mod:`optuna_quant.storages.factory`); any other is refused.
        study_name: The study's name in the storage.
        trials_load_method: ``cold_start``, ``warm_start``, ``fine_tune`` or ``eval`` (POT's).
            Every worker of a shared study uses ``warm_start``: it runs on the search space that
            the study stored (a ``fine_tune`` study's narrowed one), which must have the
            parameters that ``scopes`` and ``nodes`` give here.
        stop_on_target: Stop every worker once a trial meets both targets.
        scopes: The tuning scopes that vary: ``layer``, ``range_estimator``, ``granularity``,
            ``mode`` (activation and weight symmetry, two parameters) and ``op_types`` (see
            :mod:`optuna_quant.trial.space`). Under ``fine_tune``, the scopes that vary around the
            previous best.
        nodes: Restrict the ``layer`` scope to these node names (of the prepared model).
        layer_groups: ``"block"`` or ``"role"``: on a transformer, one ``layer`` parameter per
            block or per role (query, key, value, attention, attention output, feed-forward in
            and out) that keeps the whole group in fp32 or int8, read from the module or node
            names and the graph (:mod:`optuna_quant.quantization.groups`); ``None`` (the
            default): one parameter per layer.
        benchmark: Latency settings (:class:`BenchmarkSettings` or its fields as a dict).
        metrics: The fp32 accuracy, when known: skips the fp32 evaluation.
        eval_subset_size: Evaluate every model on the first N samples only.
        example_inputs: Example inputs of a ``torch.nn.Module`` model.
        objective_mode: ``"loss"`` (default) minimises POT's loss; ``"pareto"`` makes a
            two-objective study (minimise ``acc_loss``, maximise ``lat_diff``) whose Pareto front
            optuna-dashboard shows. ``best_result`` follows POT's rule in both.
        artifact_dir: Folder of the artifact store for the best model (optuna-dashboard's
            ``--artifact-dir``); default beside the SQLite file, or ``./optuna_quant-artifacts``.
        heartbeat_interval: Seconds between heartbeats of a running trial (on every storage but
            one in memory), which run again the trial of a worker that died.
        grace_period: Seconds without a heartbeat after which a trial's worker counts as dead.
        pre_process: Prepare the model with onnxruntime's ``quant_pre_process`` (BatchNorm
            folding, graph optimization) before quantizing it; ``"transformer"`` runs
            onnxruntime's transformer optimizer after it. fp32 accuracy and latency are measured
            on the model as given (see :mod:`optuna_quant.quantization.prepare`).
        sensitivity: After the reference trial, measure once what each choice and each layer
            costs and store it with the study (the dashboard's sensitivity chart); it becomes the
            prior of optuna-quant's samplers and queues a few start-up trials (see
            :mod:`optuna_quant.trial.guidance`).
        latency_data: The input to time every model on, as you will run it: a
            ``{input_name: array}`` dict (an array for a single input) at the batch and sequence
            length of production. Default: ``benchmark.batch_size`` samples of the calibration
            data. Checked against the model's inputs and run once, before any trial.

    Returns:
        The :class:`QuantStudy`.

    Raises:
        ValueError, TypeError, FileNotFoundError: For bad input, or a stored study made with
            another search space or joined from a CPU of another int8 class (under warm_start:
            before the model is read), before any trial runs; a storage that cannot be opened raises
            :class:`optuna_quant.storages.urls.StorageError` (a ``ValueError``) naming its URL, and
            so does one whose workers optuna-quant cannot keep apart, before anything is written.
    """
    # Stages, in this order so that nothing stored is touched before every check passed:
    # settings; the storage, read only; the model and data (preparation, calibration: the
    # objective); the folders written to; only then the study is deleted, created or joined.
    logs.configure()  # POT users read the log lines: shown, each once, unless set otherwise
    logs.compact_trial_lines(map(logging.getLogger, TRIAL_LINE_LOGGERS), LAYER_PREFIX)  # Optuna's, where shown
    if objective_mode not in OBJECTIVE_MODES:
        raise ValueError(f"Unknown objective_mode {objective_mode!r}; choose from {OBJECTIVE_MODES}.")
    targets = Targets(accuracy_loss, latency_reduce, accuracy_weight, latency_weight)
    eval_fn = eval_function(eval_fn, eval_data)
    if isinstance(benchmark, dict):
        benchmark = BenchmarkSettings.from_dict(benchmark)
    sampler_obj = make_sampler(sampler, seed)
    heartbeat = Heartbeat(heartbeat_interval, grace_period)
    storage_obj = open_storage(storage, grace_period=grace_period)
    scopes = tuple(scopes)
    cpu = int8_support()
    plan = plan_load(
        trials_load_method, study_name, storage_obj, scopes=scopes, targets=targets, sampler=sampler_obj, int8_class=cpu.int8_class
    )
    node_modules: dict[str, str] = {}
    if not isinstance(model, (str, Path, onnx.ModelProto)):
        from optuna_quant.quantization.torch_export import export_module

        model, node_modules = export_module(model, example_inputs)
    if in_memory(storage_obj):
        heartbeat = None  # no other process can watch it
    lock = study_lock(storage_obj, plan.name, heartbeat)
    objective = QuantizationObjective(
        model, calibration_data, eval_fn,
        targets=targets, scopes=scopes, nodes=nodes, space=plan.space, benchmark=benchmark,
        fp32_accuracy=metrics, eval_subset_size=eval_subset_size, pre_process=pre_process,
        stop_on_target=stop_on_target, objective_mode=objective_mode, lock=lock, heartbeat=heartbeat,
        guided=sensitivity, latency_data=latency_data, layer_groups=layer_groups, module_of_node=node_modules,
    )
    artifact_dir = default_artifact_dir(storage_obj, artifact_dir)
    if plan.method == "eval":
        study = open_study(plan, storage_obj, sampler_obj, objective_mode)
        return QuantStudy(study, objective, storage_obj, artifact_dir, run_trials=False)
    check_writable(artifact_dir, "artifact_dir", folder=True)
    study = open_study(plan, storage_obj, sampler_obj, objective_mode)
    with lock():
        objective.space = records.share_records(
            study,
            space=objective.space,
            fingerprint=objective.measurer.fingerprint,
            targets=targets,
            int8_class=cpu.int8_class,
            node_modules=node_modules,
        )
    if study.metric_names is None:
        with optuna_warnings_off():
            study.set_metric_names(METRIC_NAMES[objective_mode])
    return QuantStudy(study, objective, storage_obj, artifact_dir)

