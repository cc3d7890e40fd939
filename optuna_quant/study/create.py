"""``create_study``: a quantization study on Optuna, with POT's options, checked before anything
is stored; it returns the :class:`~optuna_quant.study.study.QuantStudy` that runs it.

Example:
    >>> import optuna_quant as oq
    >>> study = oq.create_study(model="model.onnx", calibration_data=calib,   # doctest: +SKIP
    ...                         eval_fn=evaluate, accuracy_loss=1.0, latency_reduce=1.5)
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
from optuna_quant.measure.cpu import int8_support
from optuna_quant.measure.evaluate import eval_function
from optuna_quant.measure.evaluate import EvalFn
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.loss import Targets
from optuna_quant.pruners import LatencyPruner
from optuna_quant.quantization.model_io import ModelLike
from optuna_quant.samplers.factory import DEFAULT_SAMPLER
from optuna_quant.samplers.factory import make_sampler
from optuna_quant.storages.artifacts import check_writable
from optuna_quant.storages.factory import open_storage
from optuna_quant.storages.heartbeat import GRACE_PERIOD
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.heartbeat import HEARTBEAT_INTERVAL
from optuna_quant.storages.lock import claim_locks
from optuna_quant.storages.lock import in_memory
from optuna_quant.storages.lock import study_lock
from optuna_quant.storages.rdb import default_artifact_dir
from optuna_quant.storages.rdb import optuna_warnings_off
from optuna_quant.study.load_methods import open_study
from optuna_quant.study.load_methods import plan_load
from optuna_quant.study.study import QuantStudy
from optuna_quant.trial import records
from optuna_quant.trial.budget import SENSITIVITY_SHARE
from optuna_quant.trial.objective import OBJECTIVE_MODES
from optuna_quant.trial.objective import QuantizationObjective
from optuna_quant.trial.space import LAYER_PREFIX
from optuna_quant.trial.space import SCOPES


__all__ = ["create_study"]

METRIC_NAMES = {"loss": ["loss"], "pareto": ["acc_loss", "lat_diff"]}
SENSITIVITY_CHOICES: tuple[bool | str, ...] = (True, False, "full")
"""``create_study``'s ``sensitivity``: within its share of the study's time, none, or all of it."""


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
    sampler: str | optuna.samplers.BaseSampler = DEFAULT_SAMPLER,
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
    sensitivity: bool | str = True,
    recipes: bool = True,
    pruning: bool = True,
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
        sampler: ``"gp"`` (default), ``"tpe"``, ``"random"``, or any Optuna sampler.
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
        sensitivity: After the reference and the recipes, measure once what each choice and
            each layer costs and store it with the study (the dashboard's sensitivity chart); it
            becomes the prior of optuna-quant's samplers and queues a few start-up trials (see
            :mod:`optuna_quant.trial.guidance`). ``True`` measures what a quarter of the study's
            time affords (:mod:`optuna_quant.trial.budget`), ``"full"`` all of it whatever it
            costs, ``False`` nothing.
        recipes: Queue the simple recipes (dynamic and static, per tensor and per channel:
            :mod:`optuna_quant.trial.recipes`) right after the reference, cheapest first, so
            that the study holds the best of them within a few trials.
        pruning: Stop a trial's timing once every block timed says its model is slower than
            the best model within the accuracy target (:class:`optuna_quant.pruners.LatencyPruner`,
            the study's pruner), and its evaluation, where ``eval_fn`` scores by samples
            (:class:`~optuna_quant.measure.evaluate.SampleScores`), once it is confidently over
            the accuracy target (:mod:`optuna_quant.measure.paired`); the trial is recorded as
            pruned with what it measured. Only in ``"loss"`` mode.
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
    if sensitivity not in SENSITIVITY_CHOICES:
        raise ValueError(f"sensitivity must be one of {SENSITIVITY_CHOICES}, got {sensitivity!r}.")
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
    # The reference trial scores fp32 first: a study that has none yet scores it while preparing.
    stored = plan.existing is not None and records.reference_scaling(plan.existing) is not None
    needs_reference = plan.method != "eval" and not stored
    objective = QuantizationObjective(
        model, calibration_data, eval_fn,
        targets=targets, scopes=scopes, nodes=nodes, space=plan.space, benchmark=benchmark,
        fp32_accuracy=metrics, eval_subset_size=eval_subset_size, pre_process=pre_process,
        stop_on_target=stop_on_target, objective_mode=objective_mode, lock=lock, heartbeat=heartbeat,
        claim_locks=claim_locks(storage_obj, plan.name, heartbeat),
        guided=bool(sensitivity), sensitivity_share=None if sensitivity == "full" else SENSITIVITY_SHARE,
        recipes=recipes, prune=pruning and objective_mode == "loss", latency_data=latency_data,
        layer_groups=layer_groups, module_of_node=node_modules,
        fp32_alongside=needs_reference,
    )
    artifact_dir = default_artifact_dir(storage_obj, artifact_dir)
    pruner = LatencyPruner() if objective.settings.prune else None
    if plan.method == "eval":
        study = open_study(plan, storage_obj, sampler_obj, objective_mode, pruner)
        return QuantStudy(study, objective, storage_obj, artifact_dir, run_trials=False)
    check_writable(artifact_dir, "artifact_dir", folder=True)
    study = open_study(plan, storage_obj, sampler_obj, objective_mode, pruner)
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

