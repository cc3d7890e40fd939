"""Microsoft Olive's quantization search, as a peer baseline of the real-model benchmark.

Olive (``olive-ai``) tunes onnxruntime's post-training quantization with a search of its own: its
``OnnxQuantization`` pass declares a search space over ``quant_mode`` (dynamic or static),
``precision`` (int8, uint8), ``per_channel``, ``reduce_range``, ``quant_preprocess`` and, for
static quantization only, ``calibrate_method`` (MinMax, Entropy, Percentile), ``quant_format``
(QOperator, QDQ) and ``activation_type`` (tied to the format and precision). :func:`olive_search`
runs that pass alone in an Olive workflow, with Olive's own search defaults, as an Olive user
would write it:

- search strategy: ``execution_order`` "joint", Optuna's TPE sampler (``sampler`` "tpe") seeded
  with ``seed``, ``max_samples`` = ``trials``;
- evaluator: the workload's ``eval_fn`` as a custom metric (``accuracy-score``, priority 1,
  higher is better) with the goal ``percent-max-degradation`` of ``100 * max_drop``, and Olive's
  latency metric (``latency-avg``, priority 2, lower is better, Olive's 10 warm-up and 20 timed
  runs) on the workload's first calibration feed, in a session with one intra-op thread as the
  benchmark times models;
- static quantization calibrates on all of ``workload.feeds()``, through an Olive data config
  whose dataset is registered in Olive's data registry for the call.

Olive resolves ``percent-max-degradation`` (olive/engine/engine.py, ``resolve_goals``) into the
threshold ``fp32 * (1 - value / 100)`` for a higher-is-better metric: a relative drop of at most
``max_drop``, as ``relative_accuracy_loss`` measures it and as the NNCF and INC baselines are
given. (``max-degradation`` would be an absolute drop in the score's own units.)

Olive keeps the candidates that meet every goal, marks their Pareto front over (score, latency),
and ranks it by the priorities (the score first); the model returned here is the front's fastest
by Olive's ``latency-avg``: the fastest model within the accuracy goal.

Olive is not a dependency of optuna-quant: its wheel runs from a virtual environment of its own
(``.venv-olive``, olive-ai 0.13.0 with a CPU build of torch), so it is imported inside the function.

What Olive 0.13.0 does on the way, as found on silero_vad and all-MiniLM-L6-v2:

- three pydantic-v2 bugs in how Olive dumps its configs stop any workflow with a custom metric
  before it starts; :func:`_olive_pydantic_fixes` works around them for the call, and the
  evaluator is named (``OnnxEvaluator``) for a fourth;
- a search point of dynamic quantization that differs from one already run only in the static
  parameters it ignores fails its step (``FootprintNode`` has no field ``model_config``, on the
  engine's cache hit): a sample spent, no model lost;
- on inputs of varying shape (MiniLM's batches of different sequence lengths) onnxruntime's
  Entropy and Percentile calibrators fail (``np.asarray`` of histograms of different shapes,
  onnxruntime/quantization/calibrate.py ``collect_absolute_value``): those candidates count as
  failed quantizations.

Example:
    >>> from benchmarks.real_models.baselines import measure  # doctest: +SKIP
    >>> from benchmarks.real_models.run import SETTINGS  # doctest: +SKIP
    >>> from benchmarks.real_models.workloads import build  # doctest: +SKIP
    >>> workload = build("silero_vad")  # doctest: +SKIP
    >>> int8, notes = olive_search(workload, trials=10)  # doctest: +SKIP
    >>> measure(workload, int8, SETTINGS)  # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
import contextlib
import logging
from pathlib import Path
import tempfile
import time
from typing import Any

import onnx

from benchmarks.real_models.base import Feed
from benchmarks.real_models.base import session
from benchmarks.real_models.base import Workload


PASS_TYPE = "OnnxQuantization"
DATA_CONFIG = "calibration"
# Olive's data registry is global; the component is registered again, with this call's feeds, by each call.
DATASET_COMPONENT = "optuna_quant_feeds"
ACCURACY = "accuracy-score"
LATENCY = "latency-avg"
# What a node's pass config holds besides the searched parameters: left out of the notes.
_CONFIG_NOISE = (
    "data_config",
    "save_as_external_data",
    "all_tensors_to_one_file",
    "external_data_name",
    "size_threshold",
    "convert_attribute",
)


class _Warnings(logging.Handler):
    """Collects the warnings that Olive logs during a run, and the search steps that failed.

    A step fails (Olive logs ``Step N search point ... FAILED.`` and goes on) when its pass or
    evaluation raises; the reason is the exception's first line.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: Counter[str] = Counter()
        self.failed_steps: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}" if error is not None else ""
        if record.getMessage().endswith("... FAILED."):
            self.failed_steps[reason] += 1
            return
        message = record.getMessage().splitlines()[0][:200]
        self.messages[f"{message} [{reason}]" if reason else message] += 1


def _serialize_backend(self: Any, backend: Any) -> Any:
    return backend if backend is None or isinstance(backend, str) else backend.model_dump()


def _serialize_metric_config(self: Any, metric_config: Any) -> Any:
    return None if metric_config is None else metric_config.model_dump()


@contextlib.contextmanager
def _olive_pydantic_fixes() -> Iterator[None]:
    """Work around the pydantic-v2 bugs of Olive 0.13.0 that break a workflow with a custom metric.

    Found with pydantic 2.14.4 (Olive asks for ``pydantic>=2.0``); the code is the same on Olive's
    main branch. All three are in how Olive dumps its configs (``model_dump``), which
    ``olive.workflows.run`` does in ``run_config.to_json()`` and ``Engine.initialize`` in
    ``OliveCache.prepare_resources_for_local`` (a dump, then a validation of the dump):

    - ``Metric.serialize_backend`` calls ``backend.model_dump()`` on the ``None`` backend of every
      custom metric, and ``SubMetric.serialize_metric_config`` ``metric_config.model_dump()`` on
      the ``None`` config of its sub-types (olive/evaluator/metric.py): ``PydanticSerializationError:
      Error calling function `serialize_backend`: AttributeError: 'NoneType' object has no
      attribute 'model_dump'``. Their code is swapped for code that passes ``None`` through.
    - ``Metric.user_config`` and ``SubMetric.metric_config`` are declared ``ConfigBase`` but hold
      classes made on the fly, which pydantic v2 dumps by the declared type: as ``{}``. The dump
      and validation loses the metric's ``evaluate_func`` (``ValueError: evaluate_func or
      metric_func is not specified in the metric config``) and the latency metric's
      ``inference_settings``. ``ConfigBase.model_dump`` dumps with ``serialize_as_any=True``
      instead, as ``SerializeAsAny`` on those fields would.

    Everything is put back on exit.
    """
    from olive.common.config_utils import ConfigBase
    from olive.evaluator.metric import Metric
    from olive.evaluator.metric import SubMetric
    from pydantic import BaseModel

    def model_dump(self: Any, **kwargs: Any) -> dict[str, Any]:
        return BaseModel.model_dump(self, **{"serialize_as_any": True, **kwargs})

    fixes = [
        (Metric.__pydantic_decorators__.field_serializers["serialize_backend"].func, _serialize_backend),
        (SubMetric.__pydantic_decorators__.field_serializers["serialize_metric_config"].func, _serialize_metric_config),
    ]
    originals = [function.__code__ for function, _ in fixes]
    had_dump = "model_dump" in ConfigBase.__dict__
    for function, fix in fixes:
        function.__code__ = fix.__code__
    ConfigBase.model_dump = model_dump
    try:
        yield
    finally:
        for (function, _), code in zip(fixes, originals):
            function.__code__ = code
        if not had_dump:
            del ConfigBase.model_dump


def _run_config(
    workload: Workload, fp32: Path, folder: Path, max_drop: float, trials: int, seed: int
) -> dict[str, Any]:
    """The Olive workflow: the one searchable pass, the evaluator and Olive's TPE search."""

    def score(model: Any, device: Any = None, execution_providers: Any = None) -> float:
        # Olive's custom-metric signature: evaluate_func(model handler, device, execution providers).
        return float(workload.eval_fn(session(str(model.model_path))))

    single_thread = {"onnx": {"session_options": {"intra_op_num_threads": 1, "inter_op_num_threads": 1}}}
    return {
        "input_model": {"type": "ONNXModel", "model_path": str(fp32)},
        "systems": {
            "local": {
                "type": "LocalSystem",
                "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}],
            }
        },
        "data_configs": [
            {
                "name": DATA_CONFIG,
                "load_dataset_config": {"type": DATASET_COMPONENT},
                # The feeds are already batched as the model takes them: no collation.
                "dataloader_config": {"type": "no_auto_batch_dataloader"},
            }
        ],
        "evaluators": {
            "evaluator": {
                # Named, not left to Olive's default (None): with pydantic 2.14, Olive's resource
                # scan (olive/resource_path.py, find_all_resources) tries every dict of the config
                # as a resource path, and {"type": None} ends in ResourceType._missing_(None),
                # an AttributeError that the scan does not catch (Engine.initialize fails).
                "type": "OnnxEvaluator",
                "metrics": [
                    {
                        "name": "accuracy",
                        "type": "custom",
                        "sub_types": [
                            {
                                "name": "score",
                                "priority": 1,
                                "higher_is_better": True,
                                "goal": {"type": "percent-max-degradation", "value": 100 * max_drop},
                            }
                        ],
                        "user_config": {"evaluate_func": score},
                    },
                    {
                        "name": "latency",
                        "type": "latency",
                        "data_config": DATA_CONFIG,
                        "sub_types": [{"name": "avg", "priority": 2}],
                        "user_config": {"inference_settings": single_thread},
                    },
                ],
            }
        },
        "passes": {"quantization": {"type": PASS_TYPE, "data_config": DATA_CONFIG}},
        "search_strategy": {"execution_order": "joint", "sampler": "tpe", "max_samples": trials, "seed": seed},
        "evaluator": "evaluator",
        "host": "local",
        "target": "local",
        "cache_dir": str(folder / "cache"),
        "output_dir": str(folder / "output"),
        "log_severity_level": 2,
    }


def _searched_config(node: Any) -> dict[str, Any]:
    """The pass config of a footprint node, without the data config, the external-data options, the
    unset options, and the static-only parameters of dynamic quantization (which Olive records as
    their unresolved search parameters)."""
    config = dict(node.pass_run_config or {})
    return {
        k: v
        for k, v in config.items()
        if k not in _CONFIG_NOISE and v is not None and not isinstance(v, dict) and v != "OLIVE_IGNORED_PARAM_VALUE"
    }


def _value(node: Any, key: str) -> float | None:
    if node.metrics is None or node.metrics.value is None or key not in node.metrics.value:
        return None
    return float(node.metrics.value[key].value)


def olive_search(
    workload: Workload, max_drop: float = 0.01, trials: int = 40, seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Olive's search over ``OnnxQuantization`` for the fastest int8 model within ``max_drop``.

    The workflow runs in a temporary directory (Olive's cache, its output folder and its
    temporary files), which is removed before returning.

    Args:
        workload: The model, its calibration feeds and its ``eval_fn``.
        max_drop: The relative drop of ``eval_fn`` allowed, as a fraction (0.01 is 1 %); Olive
            wants it strictly between 0 and 1.
        trials: Olive's ``max_samples``: how many points of the search space its TPE sampler
            draws. Points that Olive discards as invalid (QOperator with int8 weights) count too,
            and so do the points of dynamic quantization that differ only in the static
            parameters it ignores: they repeat a configuration already run, whose model Olive
            finds in its cache, and Olive 0.13.0 then fails the step (``FootprintNode`` has no
            field ``model_config``; counted in the notes' ``failed_steps``).
        seed: The seed of Olive's TPE sampler.

    Returns:
        The int8 model (weights in memory) and notes: Olive's version, the search, how many
        distinct candidates Olive quantized and evaluated, how many failed (quantization,
        evaluation, or the whole search step), how many met the goal, the chosen pass config
        with its score and latency, each candidate's config, score and latency, the fp32 score
        and latency as Olive measured them, the goal's threshold, the other warnings Olive
        logged, and the wall time (Olive's import included).

    Raises:
        ValueError: If ``max_drop`` is not strictly between 0 and 1.
        RuntimeError: If Olive produced no model within the goal (with how many candidates it
            tried and the best score among them).
    """
    if not 0 < max_drop < 1:
        raise ValueError(
            f"max_drop must be strictly between 0 and 1 for Olive's percent-max-degradation, not {max_drop}"
        )
    start = time.perf_counter()
    import olive
    from olive.data.registry import Registry
    from olive.model import ModelConfig
    from olive.workflows import run as olive_run

    feeds: list[Feed] = workload.feeds()

    @Registry.register_dataset(DATASET_COMPONENT)
    def _calibration_feeds() -> list[Feed]:
        return feeds

    collected = _Warnings()
    olive_logger = logging.getLogger("olive")
    saved_tempdir = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="olive_search_") as name:
        folder = Path(name)
        fp32 = folder / "fp32.onnx"
        onnx.save(workload.onnx_model(), str(fp32))
        olive_logger.addHandler(collected)
        try:
            with _olive_pydantic_fixes():
                # ``tempdir`` sets tempfile.tempdir for the whole process: put back afterwards.
                config = _run_config(workload, fp32, folder, max_drop, trials, seed)
                output = olive_run(config, tempdir=str(folder / "tmp"))
        finally:
            olive_logger.removeHandler(collected)
            tempfile.tempdir = saved_tempdir
        footprint = output.footprint
        nodes = [node for node in footprint.nodes.values() if node.parent_model_id is not None]
        failed_quantization = [node for node in nodes if (node.model_config_data or {}).get("is_pruned")]
        failed_evaluation = [node for node in nodes if node not in failed_quantization and node.metrics is None]
        evaluated = [node for node in nodes if node.metrics is not None]
        meeting = [node for node in evaluated if node.metrics.if_goals_met]
        front = [footprint.nodes[model_id] for model_id in (footprint.output_model_ids or [])]
        front = [
            node for node in front if node.parent_model_id is not None and node.metrics and node.metrics.if_goals_met
        ]
        input_node = footprint.nodes[footprint.input_model_id]
        goal = footprint.objective_dict.get(ACCURACY, {}).get("goal") if footprint.objective_dict else None
        scores = [value for value in (_value(node, ACCURACY) for node in evaluated) if value is not None]
        notes: dict[str, Any] = {
            "olive_version": olive.__version__,
            "search": {
                "execution_order": "joint",
                "sampler": "tpe",
                "max_samples": trials,
                "seed": seed,
                "pass": PASS_TYPE,
                "goal": f"percent-max-degradation {100 * max_drop:g}",
            },
            "candidates": len(nodes),
            "evaluated": len(evaluated),
            "failed_quantization": len(failed_quantization),
            "failed_evaluation": len(failed_evaluation),
            "failed_configs": [_searched_config(node) for node in failed_quantization + failed_evaluation],
            "failed_steps": sum(collected.failed_steps.values()),
            "failed_step_reasons": dict(collected.failed_steps),
            "met_goal": len(meeting),
            "pareto_front": len(front),
            "fp32_score": _value(input_node, ACCURACY),
            "fp32_latency_ms": _value(input_node, LATENCY),
            "score_threshold": goal,
            "warnings": dict(collected.messages.most_common(10)),
        }
        if not front:
            best = max(scores) if scores else None
            raise RuntimeError(
                f"Olive found no model within {max_drop:.1%} of the fp32 score ({notes['fp32_score']}, threshold "
                f"{goal}) in {trials} samples: {len(evaluated)} candidates evaluated of {len(nodes)} quantized "
                f"({len(failed_quantization)} failed to quantize, {len(failed_evaluation)} to evaluate, "
                f"{notes['failed_steps']} search steps failed); best score {best}. "
                f"Olive's warnings: {notes['warnings']}; failed steps: {notes['failed_step_reasons']}"
            )
        chosen = min(front, key=lambda node: _value(node, LATENCY))
        model_path = ModelConfig.from_json(chosen.model_config_data).create_model().model_path
        int8 = onnx.load(str(model_path))
        notes.update(
            chosen_config=_searched_config(chosen),
            chosen_score=_value(chosen, ACCURACY),
            chosen_latency_ms=_value(chosen, LATENCY),
            candidates_table=[
                {
                    **_searched_config(node),
                    "score": _value(node, ACCURACY),
                    "latency_ms": _value(node, LATENCY),
                    "met_goal": node.metrics.if_goals_met,
                }
                for node in evaluated
            ],
        )
    notes["wall_s"] = time.perf_counter() - start
    return int8, notes
