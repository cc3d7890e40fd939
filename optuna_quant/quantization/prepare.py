"""Preparing a model as it ships for quantization, keeping the user's model for the fp32 side.

Models as they ship are often opset 11 or 12, write ``dim_value: -1`` for a dynamic size, and
keep BatchNormalization beside their convolutions. :func:`prepare_model` makes the model that the
quantizer gets and the search space is read from:

1. sizes of ``-1`` (or 0) become symbolic dimensions, so that shape inference leaves them free;
2. an opset older than 13 (per-channel Q/DQ needs QuantizeLinear's ``axis``) is lifted with
   ``onnx.version_converter``;
3. onnxruntime's ``quant_pre_process`` (symbolic shape inference, graph optimization with
   BatchNorm folding, ONNX shape inference). When symbolic shape inference fails, it is retried
   with ``skip_symbolic_shape=True``, then with the optimization skipped too; every attempt is
   logged, and when all fail the model goes on without it;
4. with ``pre_process="transformer"``, onnxruntime's transformer optimizer
   (``onnxruntime.transformers.optimizer.optimize_model``, model type ``bert``, the heads and
   hidden size read from the graph) after it: what it fused is logged, and the model goes on
   without it when it fails or changes the outputs.

After each step the outputs are compared with the user's model on calibration feeds: a converted
model that computes something else is an error, a pre-processed one is dropped with a warning.
The user's model stays in :attr:`PreparedModel.original`, so that fp32 accuracy and latency are
measured on what the user runs and ``lat_diff`` is the speed-up the user gets. Optimization
removes and renames nodes: build the search space from :attr:`PreparedModel.prepared`.

Example:
    >>> prepared = prepare_model("ocr.onnx", feeds)            # doctest: +SKIP
    >>> prepared.steps                                          # doctest: +SKIP
    ('dynamic dims: x[0]', 'opset 11 -> 13', 'quant_pre_process: 566 -> 150 nodes')
    >>> space = SearchSpace.from_model(prepared.prepared)       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
import copy
from dataclasses import dataclass
from dataclasses import field
import logging
from pathlib import Path
import tempfile
import traceback
from typing import Any

import numpy as np
import onnx
import onnx.version_converter
import onnxruntime as ort
from onnxruntime.quantization.shape_inference import quant_pre_process

from optuna_quant.quantization.config import subgraph_quantizable_nodes
from optuna_quant.quantization.model_io import Feed
from optuna_quant.quantization.model_io import load_checked
from optuna_quant.quantization.model_io import LoadedModel
from optuna_quant.quantization.model_io import MIN_OPSET
from optuna_quant.quantization.model_io import ModelLike
from optuna_quant.quantization.model_io import name_nodes
from optuna_quant.quantization.model_io import opset_of


_logger = logging.getLogger(__name__)

CHECK_FEEDS = 4
"""How many calibration feeds the output checks run."""
RTOL = 1e-3
"""Largest output difference allowed, relative to the largest absolute value of that output."""
PRE_PROCESS_ATTEMPTS: tuple[dict[str, bool], ...] = (
    {},
    {"skip_symbolic_shape": True},
    {"skip_symbolic_shape": True, "skip_optimization": True},
)
"""``quant_pre_process`` options tried in order until one succeeds."""
PRE_PROCESS_CHOICES: tuple[bool | str, ...] = (True, False, "transformer")
"""``pre_process``: ``quant_pre_process``, nothing, or ``quant_pre_process`` and onnxruntime's
transformer optimizer."""


@dataclass(frozen=True)
class PreparedModel:
    """The user's model and the one prepared for quantization.

    Attributes:
        original: The model as the user gave it (checked, unnamed nodes named): measure fp32
            accuracy and latency on it.
        prepared: The model to quantize and to read the search space from.
        steps: What preparation did, in order, one readable line each.
        shapes_inferred: Whether ``prepared`` holds ONNX shape inference's value_info (the last
            step that changed it was ``quant_pre_process``, which ends with it), so that a
            quantizer need not infer them again.
        outputs: The user's model's outputs on the first :data:`CHECK_FEEDS` feeds, which
            every step was checked against (and a recovery transform is).
    """

    original: onnx.ModelProto
    prepared: onnx.ModelProto
    steps: tuple[str, ...]
    shapes_inferred: bool = False
    outputs: tuple[list[np.ndarray], ...] = field(default=(), compare=False, repr=False)


def prepare_model(
    model: ModelLike | LoadedModel,
    feeds: Sequence[Feed],
    *,
    pre_process: bool | str = True,
    session: ort.InferenceSession | None = None,
) -> PreparedModel:
    """Prepare ``model`` for quantization, checked against its own outputs on ``feeds``.

    Args:
        model: An ONNX model: a path (external data is loaded from beside it), a ``ModelProto``,
            or a model that :func:`~optuna_quant.quantization.model_io.load_checked` loaded
            (taken as it is, neither copied nor checked again).
        feeds: Input dicts (see :func:`optuna_quant.quantization.model_io.to_feeds`); the first
            :data:`CHECK_FEEDS` check each step's outputs.
        pre_process: Run onnxruntime's ``quant_pre_process`` (``True``), and its transformer
            optimizer after it (``"transformer"``), or neither (``False``).
        session: An onnxruntime session of ``model``, which gives its own outputs: a caller
            that holds one saves building another.

    Raises:
        FileNotFoundError, ValueError: For a bad model (see :func:`optuna_quant.quantization.model_io.load_model`),
            an opset the converter cannot lift, or a conversion that changes the outputs.
    """
    if not (isinstance(pre_process, bool) or pre_process == "transformer"):
        raise ValueError(f"pre_process must be one of {PRE_PROCESS_CHOICES}, got {pre_process!r}.")
    loaded = model if isinstance(model, LoadedModel) else load_checked(model)
    original = loaded.proto
    checks = list(feeds[:CHECK_FEEDS])
    try:
        expected = run_feeds(session if session is not None else check_session(loaded.serialized), checks)
    except Exception as err:
        raise ValueError(f"The model does not run in onnxruntime on the calibration data: {err}") from err
    steps: list[str] = []
    work = original  # copied by the first step that changes it
    if _dynamic_dims(original):
        work = _copy(original)
        steps.append(f"dynamic dims: {', '.join(_free_dynamic_dims(work))}")
    opset = opset_of(work)
    if opset < MIN_OPSET:
        work = _upgraded(work, opset)
        mismatch = output_mismatch(work, checks, expected)
        if mismatch:
            raise ValueError(
                f"Converting the model from opset {opset} to {MIN_OPSET} changes its outputs: {mismatch}. "
                f"Re-export the model with opset {MIN_OPSET} or later."
            )
        steps.append(f"opset {opset} -> {MIN_OPSET}")
    shapes_inferred = False
    if pre_process:
        given = work
        work = _pre_processed(work, checks, expected, steps, loaded.serialized if work is original else None)
        shapes_inferred = work is not given
    if pre_process == "transformer":
        fused = work
        work = _transformer_optimized(work, checks, expected, steps)
        shapes_inferred = shapes_inferred and work is fused
    if work is original:  # the prepared model is the quantizer's own
        work = _copy(original)
    name_nodes(work)
    for step in steps:
        _logger.info("Prepared the model: %s", step)
    inside = subgraph_quantizable_nodes(work)
    if inside:
        _logger.warning(
            "%d quantizable nodes sit inside If/Loop/Scan bodies and stay fp32 (onnxruntime "
            "quantizes the top-level graph only): %s",
            len(inside),
            ", ".join(inside),
        )
    return PreparedModel(
        original=original, prepared=work, steps=tuple(steps), shapes_inferred=shapes_inferred, outputs=tuple(expected)
    )


def _dynamic_dims(model: onnx.ModelProto) -> list[tuple[onnx.ValueInfoProto, int]]:
    """The sizes of -1 or 0 of the graph's inputs, outputs and value_info: value and axis."""
    graph = model.graph
    return [
        (value, axis)
        for value in [*graph.input, *graph.output, *graph.value_info]
        for axis, dim in enumerate(value.type.tensor_type.shape.dim)
        if dim.HasField("dim_value") and dim.dim_value <= 0
    ]


def _free_dynamic_dims(model: onnx.ModelProto) -> list[str]:
    """Turn :func:`_dynamic_dims` into named free dims, in place; their names."""
    freed = []
    for value, axis in _dynamic_dims(model):
        value.type.tensor_type.shape.dim[axis].dim_param = f"{value.name}_dim{axis}"
        freed.append(f"{value.name}[{axis}]")
    return freed


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    return copied


def _upgraded(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    try:
        upgraded = onnx.version_converter.convert_version(model, MIN_OPSET)
        onnx.checker.check_model(upgraded)
    except Exception as err:
        raise ValueError(
            f"The model's opset {opset} could not be converted to opset {MIN_OPSET}, which "
            f"per-channel quantization needs (onnx.version_converter: {err}). Re-export the model "
            f"with opset {MIN_OPSET} or later."
        ) from err
    return upgraded


def _pre_processed(
    model: onnx.ModelProto,
    checks: list[Feed],
    expected: list[list[np.ndarray]],
    steps: list[str],
    serialized: bytes | None = None,
) -> onnx.ModelProto:
    """``model`` after the first of :data:`PRE_PROCESS_ATTEMPTS` that succeeds and keeps its
    outputs, or ``model`` (logged); ``serialized``: ``model``'s bytes where the caller has them."""
    with tempfile.TemporaryDirectory(prefix="optuna-quant-prep-") as tmp:
        # A path, not the ModelProto: onnxruntime 1.32 fails to optimize a ModelProto whose
        # weights are all inline once symbolic shape inference is skipped.
        source, output = Path(tmp) / "model.onnx", Path(tmp) / "prepared.onnx"
        if serialized is None:
            onnx.save(model, str(source))
        else:
            source.write_bytes(serialized)
        for options in PRE_PROCESS_ATTEMPTS:
            label = "quant_pre_process" + "".join(f" {key}" for key in options)
            errors = _ErrorRecords()
            pre_logger = logging.getLogger("onnxruntime.quantization.shape_inference")
            pre_logger.addHandler(errors)
            try:
                with _no_stray_file(SYMBOLIC_SHAPE_DUMP):
                    quant_pre_process(str(source), str(output), **options)
                failure = errors.first
            except Exception as err:  # symbolic shape inference raises on what it cannot infer
                frame = traceback.extract_tb(err.__traceback__)[-1]
                failure = f"{type(err).__name__}({err}) at {Path(frame.filename).name}:{frame.lineno}"
            finally:
                pre_logger.removeHandler(errors)
            if failure is None:
                prepared = onnx.load(str(output))
                mismatch = output_mismatch(prepared, checks, expected)
                if mismatch is None:
                    steps.append(f"{label}: {len(model.graph.node)} -> {len(prepared.graph.node)} nodes")
                    return prepared
                failure = f"outputs changed: {mismatch}"
            _logger.warning("%s failed (%s); trying the next fallback.", label, failure.splitlines()[0])
    steps.append("quant_pre_process skipped: every attempt failed")
    return model


def _transformer_optimized(
    model: onnx.ModelProto, checks: list[Feed], expected: list[list[np.ndarray]], steps: list[str]
) -> onnx.ModelProto:
    """``model`` fused by onnxruntime's transformer optimizer, or ``model`` when that fails or
    changes the outputs (logged)."""
    from onnxruntime.transformers.optimizer import optimize_model

    try:
        # num_heads and hidden_size 0: read from the graph; opt_level 0: its fusions only, the
        # session's own optimizations run when onnxruntime loads the model anyway.
        optimizer = optimize_model(copy.deepcopy(model), model_type="bert", num_heads=0, hidden_size=0, opt_level=0)
        optimized = optimizer.model
        failure = output_mismatch(optimized, checks, expected)
    except Exception as err:
        failure = f"{type(err).__name__}: {err}"
    if failure is not None:
        _logger.warning("The transformer optimizer failed (%s); going on without it.", failure.splitlines()[0])
        steps.append("transformer optimizer skipped: it failed")
        return model
    fused = {op: n for op, n in optimizer.get_fused_operator_statistics().items() if n}
    listed = ", ".join(f"{n} {op}" for op, n in fused.items()) or "nothing"
    steps.append(f"transformer optimizer (bert) fused {listed}: {len(model.graph.node)} -> {len(optimized.graph.node)} nodes")
    return optimized


# onnxruntime's symbolic shape inference dumps the model here, in the current directory, when it
# fails; the user's folder is no place for it.
SYMBOLIC_SHAPE_DUMP = Path("sym_shape_infer_temp.onnx")


@contextmanager
def _no_stray_file(path: Path) -> Iterator[None]:
    """Remove ``path`` and its external data after the block if the block wrote it.

    onnx names the data file of such a dump ``<uuid>.data``: the dump itself says where it is. A
    dump left by an earlier run (one killed inside the step) is no reason to keep this one's.
    """
    before = _modified(path)
    try:
        yield
    finally:
        if _modified(path) not in (None, before):
            dump = onnx.load(str(path), load_external_data=False)
            locations = {
                entry.value
                for tensor in dump.graph.initializer
                for entry in tensor.external_data
                if entry.key == "location"
            }
            for stray in (path, *(path.parent / location for location in locations)):
                stray.unlink(missing_ok=True)


def _modified(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


class _ErrorRecords(logging.Handler):
    """The first error that ``quant_pre_process`` logs instead of raising (a failed optimization)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.first is None:
            self.first = record.getMessage()


def check_session(model: onnx.ModelProto | bytes) -> ort.InferenceSession:
    """An onnxruntime session of ``model`` (or its bytes) for the output checks: default options, quiet."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    serialized = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])


def run_feeds(session: ort.InferenceSession, feeds: Sequence[Feed]) -> list[list[np.ndarray]]:
    """``session``'s outputs on each of ``feeds``."""
    return [session.run(None, feed) for feed in feeds]


def output_mismatch(model: onnx.ModelProto, feeds: Sequence[Feed], expected: Sequence[Sequence[np.ndarray]]) -> str | None:
    """How ``model``'s outputs on ``feeds`` differ from ``expected`` beyond :data:`RTOL`, in
    words, or ``None`` where they do not."""
    outputs = [value.name for value in model.graph.output]
    try:
        results = run_feeds(check_session(model), feeds)
    except Exception as err:  # an invalid conversion can fail only when onnxruntime loads it
        return f"it does not run in onnxruntime ({err})"
    for index, (got, want) in enumerate(zip(results, expected)):
        for name, a, b in zip(outputs, got, want):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                return f"output {name!r} has shape {a.shape} instead of {b.shape} on feed {index}"
            if a.size == 0:
                continue
            error, scale = _max_abs(a.astype(np.float64) - b), max(_max_abs(b), 1e-12)
            if not error <= RTOL * scale:
                return f"output {name!r} differs by {error:.3g} (largest value {scale:.3g}) on feed {index}"
    return None


def _max_abs(array: Any) -> float:
    return float(np.max(np.abs(array)))
