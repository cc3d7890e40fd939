"""Quantization recipes that need no tuning, measured as the studies' trials are.

- ``ort_default``: onnxruntime's ``quantize_static`` with its defaults, on the model as given;
- ``ort_preprocessed``: the same after ``quant_pre_process`` (shape inference, graph optimization,
  BatchNorm folding), retried without symbolic shape inference where that fails;
- ``ort_dynamic``, ``ort_dynamic_per_channel``: ``quantize_dynamic`` (weights int8 ahead of time,
  activations quantized as they come), onnxruntime's recipe for transformers, per tensor (its
  default) and per channel;
- ``ort_dynamic_fused``: onnxruntime's transformer optimizer (``optimize_model``, model type
  ``bert``, heads and hidden size read from the graph) before ``quantize_dynamic``, as
  onnxruntime's BERT notebooks do; what it fused is recorded (on a torch 2.13 export of
  all-MiniLM-L6-v2 the layer norms and Gelus, not the attention);
- ``nncf``: NNCF's ``quantize_with_accuracy_control`` (ONNX backend, 1 % relative drop allowed),
  which quantizes everything and then reverts layers ranked by their effect on the outputs until
  the drop is met;
- ``inc``: Intel Neural Compressor's tuning of ONNX models (``onnx-neural-compressor``'s
  ``autotune``, 1 % relative drop allowed) over its own tuning spaces, static then dynamic; it
  stops at the first configuration within the drop;
- ``olive``: Microsoft Olive's search over its ``OnnxQuantization`` pass
  (:mod:`benchmarks.real_models.olive_search`): the fastest model within a 1 % drop of 40 samples.

The two peers run from virtual environments of their own (``make peers``, docs/real-models.md):
INC's wheel wants ``numpy<2``, Olive brings many packages.

Each int8 model is scored by the workload's ``eval_fn`` and timed against the model as given with
``optuna_quant.measure.latency.measure_latency`` (one thread, paired blocks), on the input the
studies time their trials on.

Example:
    >>> workload = WORKLOADS["silero_vad"]()              # doctest: +SKIP
    >>> measure(workload, ort_default(workload), SETTINGS)  # doctest: +SKIP
    {'fp32_accuracy': 0.95, 'accuracy': 0.95, 'acc_loss': 0.0, 'lat_diff': 1.1, 'spread': 0.02}
"""

from __future__ import annotations

from collections.abc import Callable
import contextlib
from pathlib import Path
import tempfile
from typing import Any

import onnx
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization import quant_pre_process
from onnxruntime.quantization import quantize_dynamic
from onnxruntime.quantization import quantize_static

from benchmarks.real_models.base import Feed
from benchmarks.real_models.base import session
from benchmarks.real_models.base import Workload
from benchmarks.real_models.olive_search import olive_search
from optuna_quant.measure.int8_causes import INT8_KERNELS
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.latency import LatencyResult
from optuna_quant.measure.latency import measure_latency
from optuna_quant.measure.loss import relative_accuracy_loss
from optuna_quant.quantization.model_io import batch_of


COMPUTE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: list[Feed]) -> None:
        self._all = feeds
        self._feeds = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self._feeds, None)

    def rewind(self) -> None:
        """Start again from the first feed (INC calibrates each configuration it tries)."""
        self._feeds = iter(self._all)


def _fp32_copy(workload: Workload) -> onnx.ModelProto:
    """A copy of the fp32 model: onnxruntime's quantization tools move a ModelProto's weights
    into external data in place, which would break every later use of the workload's model."""
    model = onnx.ModelProto()
    model.CopyFrom(workload.onnx_model())
    return model


def _quantize_static(model: Path, workload: Workload, folder: Path) -> onnx.ModelProto:
    out = folder / "int8.onnx"
    quantize_static(model, out, _Reader(workload.feeds()))
    return onnx.load(str(out))


def ort_default(workload: Workload) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """``quantize_static`` with onnxruntime's defaults, on the model as given."""
    with tempfile.TemporaryDirectory() as folder:
        fp32 = Path(folder) / "fp32.onnx"
        onnx.save(_fp32_copy(workload), fp32)
        return _quantize_static(fp32, workload, Path(folder)), {}


def ort_preprocessed(workload: Workload) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """``quant_pre_process`` then ``quantize_static`` with its defaults.

    Symbolic shape inference fails on some models; the documented fallback skips it.
    """
    with tempfile.TemporaryDirectory() as folder:
        fp32, prepared = Path(folder) / "fp32.onnx", Path(folder) / "prepared.onnx"
        # From a file, as its users call it: given a ModelProto of 90 MB (all-MiniLM-L6-v2) it
        # writes the weights beside a file name of its own and fails to read them back.
        onnx.save(_fp32_copy(workload), fp32)
        notes: dict[str, Any] = {"skip_symbolic_shape": False}
        # Symbolic shape inference leaves sym_shape_infer_temp.onnx in the working directory.
        with contextlib.chdir(folder):
            try:
                quant_pre_process(fp32, prepared)
            except Exception as err:  # onnxruntime raises bare Exceptions from its shape inference
                notes = {"skip_symbolic_shape": True, "symbolic_shape_error": f"{type(err).__name__}: {err}"[:300]}
                quant_pre_process(fp32, prepared, skip_symbolic_shape=True)
        return _quantize_static(prepared, workload, Path(folder)), notes


def _quantize_dynamic(workload: Workload, per_channel: bool, fuse: bool) -> tuple[onnx.ModelProto, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        fp32, int8 = Path(folder) / "fp32.onnx", Path(folder) / "int8.onnx"
        onnx.save(_fp32_copy(workload), fp32)
        notes: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        if fuse:
            from onnxruntime.transformers.optimizer import optimize_model

            # From the file: given a ModelProto, the optimizer leaves its weights in a folder it deletes.
            optimized = optimize_model(str(fp32), model_type="bert", num_heads=0, hidden_size=0)
            notes["fused"] = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
            optimized.save_model_to_file(str(fp32))
            # The fused graph loses some tensors' types, which quantize_dynamic needs.
            extra["DefaultTensorType"] = onnx.TensorProto.FLOAT
        quantize_dynamic(fp32, int8, per_channel=per_channel, extra_options=extra)
        return onnx.load(str(int8)), notes


def ort_dynamic(workload: Workload) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """``quantize_dynamic`` with its defaults (per tensor), on the model as given."""
    return _quantize_dynamic(workload, per_channel=False, fuse=False)


def ort_dynamic_per_channel(workload: Workload) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """``quantize_dynamic`` with per-channel weights, on the model as given."""
    return _quantize_dynamic(workload, per_channel=True, fuse=False)


def ort_dynamic_fused(workload: Workload) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """onnxruntime's transformer optimizer, then ``quantize_dynamic`` per channel."""
    return _quantize_dynamic(workload, per_channel=True, fuse=True)


def nncf_accuracy_control(workload: Workload, max_drop: float = 0.01) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """NNCF's ``quantize_with_accuracy_control`` with a relative drop of ``max_drop``.

    NNCF ranks layers by how far they move the outputs on the validation items (our calibration
    feeds), and judges the drop with ``validation_fn``, which here is the workload's ``eval_fn``
    on its own evaluation data.
    """
    import nncf

    feeds = workload.feeds()
    int8 = nncf.quantize_with_accuracy_control(
        _fp32_copy(workload),
        nncf.Dataset(feeds),
        nncf.Dataset(feeds),
        lambda model, _items: (workload.eval_fn(session(model)), None),
        max_drop=max_drop,
        drop_type=nncf.DropType.RELATIVE,
        subset_size=len(feeds),
    )
    return int8, {}


def inc_tuning(workload: Workload, max_drop: float = 0.01, max_trials: int = 40) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """onnx-neural-compressor's ``autotune`` with a relative drop of ``max_drop``.

    The configurations are INC's tuning spaces for static (QOperator, MinMax; four operator sets,
    per channel or not, the last MatMul or not) then dynamic quantization, tried in INC's order
    until one is within ``max_drop`` of the fp32 score (by the workload's ``eval_fn``).

    Raises:
        RuntimeError: If INC stops without a model: no configuration of the ``max_trials`` first
            within ``max_drop`` (INC exits the process then), or one that crashes INC; the message
            has the scores of the configurations tried before.
    """
    from onnx_neural_compressor.quantization import config
    from onnx_neural_compressor.quantization import tuning

    configs = [*config.StaticQuantConfig.get_config_set_for_tuning(), *config.DynamicQuantConfig.get_config_set_for_tuning()]
    tried: list[float] = []

    def score(path: str) -> float:
        tried.append(workload.eval_fn(session(path)))
        return tried[-1]

    with tempfile.TemporaryDirectory() as folder:
        fp32 = Path(folder) / "fp32.onnx"
        onnx.save(_fp32_copy(workload), fp32)
        try:
            int8 = tuning.autotune(
                str(fp32),
                tuning.TuningConfig(config_set=configs, tolerable_loss=max_drop, max_trials=max_trials),
                eval_fn=score,
                calibration_data_reader=_Reader(workload.feeds()),
            )
        except (SystemExit, Exception) as err:  # INC exits the process when nothing meets the drop
            raise RuntimeError(_inc_failure(tried, max_drop, err)) from err
    # The first score is INC's fp32 baseline, on the model after onnxruntime's basic optimizations.
    return int8, {"trials": len(tried) - 1, "fp32_score": tried[0], "scores": tried[1:]}


def _inc_failure(scores: list[float], max_drop: float, err: BaseException) -> str:
    tried = scores[1:]
    best = f"best {max(tried):.4g} against fp32 {scores[0]:.4g}" if tried else "none evaluated"
    cause = "no configuration within the drop" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
    return f"INC stopped after {len(tried)} configurations, none within {max_drop:.0%} ({best}): {cause}"


BASELINES: dict[str, Callable[[Workload], tuple[onnx.ModelProto, dict[str, Any]]]] = {
    "ort_default": ort_default,
    "ort_preprocessed": ort_preprocessed,
    "ort_dynamic": ort_dynamic,
    "ort_dynamic_per_channel": ort_dynamic_per_channel,
    "ort_dynamic_fused": ort_dynamic_fused,
    "nncf": nncf_accuracy_control,
    "inc": inc_tuning,
    "olive": olive_search,
}
PEERS = ("inc", "olive")
"""The baselines that run from an environment of their own (``make peers``), not from ``.venv``."""


def latency_feed(workload: Workload, settings: BenchmarkSettings) -> Feed:
    """The input a study of ``workload`` times its trials on: the first ``settings.batch_size``
    samples of the calibration data (``create_study`` without ``latency_data``)."""
    return batch_of(workload.feeds(), settings.batch_size)


def time_against_fp32(workload: Workload, int8: onnx.ModelProto, settings: BenchmarkSettings) -> LatencyResult:
    """``int8`` timed against the model as given, on the input the study's trials are timed on
    (:func:`latency_feed`)."""
    fp32 = session(workload.onnx_model(), settings.threads)
    return measure_latency(fp32, session(int8, settings.threads), latency_feed(workload, settings), settings)


def measure(workload: Workload, int8: onnx.ModelProto, settings: BenchmarkSettings) -> dict[str, float]:
    """Score ``int8`` and time it against the model as given, as a trial is measured
    (:func:`time_against_fp32`)."""
    fp32_accuracy = workload.eval_fn(session(workload.onnx_model(), settings.threads))
    accuracy = workload.eval_fn(session(int8, settings.threads))
    latency = time_against_fp32(workload, int8, settings)
    return {
        "fp32_accuracy": fp32_accuracy,
        "accuracy": accuracy,
        "acc_loss": relative_accuracy_loss(fp32_accuracy, accuracy),
        "lat_diff": latency.lat_diff,
        "spread": latency.spread,
        **layer_counts(int8),
    }


def layer_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many layers of ``model`` run in int8 (a Conv/MatMul/Gemm node that takes a dequantized
    input, or an integer kernel in its place), and how many Conv/MatMul/Gemm nodes do not.

    Example:
        >>> from onnx import helper
        >>> graph = helper.make_graph(
        ...     [helper.make_node("DequantizeLinear", ["q", "s"], ["x"]), helper.make_node("MatMul", ["x", "w"], ["y"]),
        ...      helper.make_node("Conv", ["y", "k"], ["z"]), helper.make_node("MatMulInteger", ["a", "b"], ["c"])],
        ...     "g", [], [])
        >>> layer_counts(helper.make_model(graph))
        {'int8_layers': 2, 'fp32_layers': 1}
    """
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    compute = [node for node in model.graph.node if node.op_type in COMPUTE_OPS]
    qdq = sum(node.input[0] in dequantized for node in compute)
    integer = sum(node.op_type in INT8_KERNELS for node in model.graph.node)
    return {"int8_layers": qdq + integer, "fp32_layers": len(compute) - qdq}
