"""Static QDQ quantization with onnxruntime, calibrating once per method and reusing the ranges.

(A configuration of the dynamic approach is built by :mod:`optuna_quant.quantization.dynamic`,
which needs no calibration; :class:`Quantizer` builds both.)

onnxruntime's ``quantize_static`` calibrates on every call. Here the activation ranges of each
calibration family are collected once (MinMax, Entropy, and one histogram shared by every
percentile), so that a trial that only changes fallback, granularity, symmetry or operator types
runs no calibration, and a new percentile costs a single ``compute_data()`` call.

Calibration feeds the data one feed at a time: onnxruntime's calibrators keep every activation
of the samples given to one ``collect_data`` call until it returns (about 230 MB a sample on a
text recognizer), and merge what successive calls collect (MinMax keeps the running min and max,
Entropy and Percentile widen their histograms with the bin width kept). Peak memory then stays
that of one feed, whatever the number of samples. Entropy's histograms are started over each
tensor's whole MinMax range (:func:`seed_histograms`), so that they are exactly those of one call
on all samples. Each one-off calibration logs a line before and
after (method, samples, seconds) on the ``optuna_quant`` logger, and its progress every
:data:`PROGRESS_SECONDS`.

Tensors whose MinMax range is not finite or reaches a fill value (:func:`unbounded_tensors`: an
attention mask of ``finfo.min``, a ``-inf`` padding) are left out of every calibration: no
histogram can span them, and no int8 scale can hold them beside real values. The nodes that read
or write them stay fp32 in every configuration, and one log line names both.

Example:
    >>> quantizer = Quantizer(model, feeds)                     # doctest: +SKIP
    >>> int8 = quantizer.quantize(QuantConfig(fallback=frozenset({"fc"})))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Iterator
from collections.abc import Sequence
import contextlib
import copy
from dataclasses import replace
import io
import logging
from pathlib import Path
import tempfile
import time

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization import QuantType
from onnxruntime.quantization.calibrate import CalibraterBase
from onnxruntime.quantization.calibrate import create_calibrator
from onnxruntime.quantization.calibrate import HistogramCalibrater
from onnxruntime.quantization.calibrate import HistogramCollector
from onnxruntime.quantization.calibrate import TensorsData
from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
from onnxruntime.quantization.quant_utils import add_infer_metadata
from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

from optuna_quant.quantization.config import op_type_sets
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.dynamic import dynamic_model
from optuna_quant.quantization.entropy import FastEntropyCollector
from optuna_quant.quantization.model_io import Feed
from optuna_quant.quantization.prepare import CHECK_FEEDS
from optuna_quant.quantization.prepare import check_session
from optuna_quant.quantization.prepare import output_mismatch
from optuna_quant.quantization.prepare import run_feeds
from optuna_quant.quantization.recovery import apply_transforms


_logger = logging.getLogger(__name__)

# onnxruntime's default of 128 bins equals num_quantized_bins and leaves Entropy a single
# candidate threshold, i.e. exactly the MinMax ranges (DESIGN.md section 7).
ENTROPY_NUM_BINS = 2048
PROGRESS_SECONDS = 10.0
"""A calibration pass longer than this logs its progress at this interval."""
FILL_FRACTION = 0.5
"""A range end beyond this fraction of its type's largest value is a fill (``finfo.min`` in an
attention mask), not data: twice it overflows the width of a histogram over the range."""
_THRESHOLD_GROUP = 8  # tensors whose histogram thresholds are computed between two progress checks


class _FeedReader(CalibrationDataReader):
    def __init__(self, feeds: Sequence[Feed]) -> None:
        self._feeds: Iterator[Feed] = iter(feeds)

    def get_next(self) -> Feed | None:
        return next(self._feeds, None)


def _family(range_estimator: str) -> tuple[CalibrationMethod, dict[str, object]]:
    if range_estimator == "minmax":
        return CalibrationMethod.MinMax, {}
    if range_estimator == "entropy":
        return CalibrationMethod.Entropy, {"num_bins": ENTROPY_NUM_BINS}
    return CalibrationMethod.Percentile, {}


def calibration_family(range_estimator: str) -> str:
    """The calibration that ``range_estimator`` needs, by onnxruntime's name (``"MinMax"``,
    ``"Entropy"`` or ``"Percentile"``, which every percentile shares), as :attr:`Quantizer.calibration_seconds` keys it.

    Example:
        >>> calibration_family("percentile_99.9")
        'Percentile'
    """
    return _family(range_estimator)[0].name


def _percentile(range_estimator: str) -> float | None:
    if range_estimator.startswith("percentile_"):
        return float(range_estimator.removeprefix("percentile_"))
    return None


def _listed(names: Sequence[str], limit: int = 8) -> str:
    """``names`` joined, the first ``limit`` of them when there are more."""
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names)} in all)"


def _samples(feeds: Sequence[Feed]) -> int:
    return sum(len(next(iter(feed.values()))) for feed in feeds)


def unbounded_tensors(ranges: TensorsData) -> tuple[str, ...]:
    """The tensors of MinMax ``ranges`` whose range has an end that is not finite or is a fill
    (beyond :data:`FILL_FRACTION` of its type's largest value), sorted.

    Example:
        >>> from onnxruntime.quantization.calibrate import TensorData
        >>> lowest = np.finfo(np.float32).min
        >>> ranges = TensorsData(CalibrationMethod.MinMax, {
        ...     "scores": TensorData(lowest=np.float32(-9.5), highest=np.float32(7.0)),
        ...     "mask": TensorData(lowest=lowest, highest=np.float32(0.0)),
        ...     "padded": TensorData(lowest=np.float32(-np.inf), highest=np.float32(3.0))})
        >>> unbounded_tensors(ranges)
        ('mask', 'padded')
    """
    unbounded = []
    for name, data in ranges.data.items():
        ends = np.concatenate([np.ravel(end) for end in data.range_value])
        limit = FILL_FRACTION * float(np.finfo(ends.dtype if ends.dtype.kind == "f" else np.float32).max)
        if not np.all(np.isfinite(ends)) or np.any(np.abs(ends.astype(np.float64)) >= limit):
            unbounded.append(name)
    return tuple(sorted(unbounded))


def nodes_around(model: onnx.ModelProto, tensors: Collection[str]) -> tuple[str, ...]:
    """The names of the nodes of ``model``'s graph that read or write one of ``tensors``."""
    wanted = set(tensors)
    return tuple(n.name for n in model.graph.node if wanted & {*n.input, *n.output})


def qdq_model(
    model: onnx.ModelProto, ranges: TensorsData, config: QuantConfig, keep_fp32: Collection[str] = ()
) -> onnx.ModelProto:
    """The QDQ model of ``config`` built by onnxruntime's ``QDQQuantizer`` from cached ranges.

    ``model`` needs value_info for its tensors (onnxruntime's ``load_model_with_shape_infer``).
    Neither ``model`` nor ``ranges`` is changed: the quantizer rewrites both, so it gets copies.
    The nodes of ``keep_fp32`` stay fp32 beside ``config.fallback``.
    """
    quantizer = QDQQuantizer(
        copy.deepcopy(model),
        config.per_channel,
        config.weight_type == "int7",  # reduce_range
        QuantType.QUInt8 if config.weight_type == "uint8" else QuantType.QInt8,
        QuantType.QInt8 if config.activation_symmetric else QuantType.QUInt8,
        copy.deepcopy(ranges),
        None,  # nodes_to_quantize: every node of op_types ...
        sorted(config.fallback | set(keep_fp32)),  # ... except these
        list(op_type_sets()[config.op_types]),
        {"ActivationSymmetric": config.activation_symmetric, "WeightSymmetric": config.weight_symmetric},
    )
    quantizer.quantize_model()
    # quantize_static sorts when it saves the file; in memory the Q/DQ nodes sit after their
    # consumers, which onnxruntime runs but onnx.checker (and tools that check) refuse.
    quantizer.model.topological_sort()
    return quantizer.model.model


def collect(calibrator: CalibraterBase, feeds: Sequence[Feed], method: str) -> None:
    """Feed ``feeds`` to ``calibrator`` one ``collect_data`` call each, logging what it does.

    onnxruntime's calibrators merge successive calls, so peak memory is that of one feed.
    """
    samples = _samples(feeds)
    _logger.info("Calibrating %s on %d samples (%d feeds) ...", method, samples, len(feeds))
    start = last = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # onnxruntime prints its progress
        for index, feed in enumerate(feeds, 1):
            calibrator.collect_data(_FeedReader([feed]))
            now = time.perf_counter()
            if now - last >= PROGRESS_SECONDS and index < len(feeds):
                last = now
                _logger.info("Calibrating %s: %d / %d feeds, %.1f s", method, index, len(feeds), now - start)
    _logger.debug("Collected %s statistics of %d samples in %.2f s", method, samples, time.perf_counter() - start)


def seed_histograms(calibrator: HistogramCalibrater, ranges: TensorsData) -> None:
    """Start ``calibrator``'s Entropy or Percentile histograms over each tensor's whole range, from
    MinMax ``ranges``.

    onnxruntime sizes an Entropy (or non-symmetric Percentile) histogram (``num_bins`` over ``[-t, t]``, ``t`` the largest
    absolute value) on the first ``collect_data`` call and widens it with the same bin width on
    later ones. Fed one sample at a time, the first sample would set the resolution: the bins
    multiply (4,854 instead of 2,048 on the demo model, entropy 40 % slower) and the thresholds
    differ from those of one call on all samples (the demo's logits clipped at 0.78 instead of
    12.2). Started over the overall range, each call adds its counts into the same bins, which
    gives exactly the histograms of one call. This fills onnxruntime's ``HistogramCollector``
    and its ``(hist, edges, min, max, threshold)`` entries, which are not public API; the
    collector is :class:`~optuna_quant.quantization.entropy.FastEntropyCollector`, whose Entropy
    thresholds are onnxruntime's, found sooner.
    """
    collector = FastEntropyCollector(
        method=calibrator.method,
        symmetric=calibrator.symmetric,
        num_bins=calibrator.num_bins,
        num_quantized_bins=calibrator.num_quantized_bins,
        percentile=calibrator.percentile,
        scenario=calibrator.scenario,
    )
    for name in calibrator.tensors_to_calibrate:
        low, high = ranges[name].range_value
        dtype = np.asarray(low).dtype
        threshold = np.array(max(abs(np.min(low)), abs(np.max(high))), dtype=dtype)
        hist, edges = np.histogram(np.empty(0, dtype), calibrator.num_bins, range=(-threshold, threshold))
        collector.histogram_dict[name] = (hist, edges, np.array(np.inf, dtype), np.array(-np.inf, dtype), threshold)
    calibrator.collector = collector


def compute(calibrator: CalibraterBase, range_estimator: str) -> TensorsData:
    """``calibrator.compute_data()``, a few histograms at a time, logging progress.

    Entropy's threshold search takes most of its calibration time on a model with hundreds of
    tensors; computing the thresholds in groups of tensors lets it say how far it is.
    """
    collector = getattr(calibrator, "collector", None)
    with contextlib.redirect_stdout(io.StringIO()):  # onnxruntime prints its progress
        if not isinstance(collector, HistogramCollector):
            return calibrator.compute_data()
        every = collector.histogram_dict
        names, data, method = list(every), {}, None
        start = last = time.perf_counter()
        try:
            for begin in range(0, len(names), _THRESHOLD_GROUP):
                collector.histogram_dict = {name: every[name] for name in names[begin : begin + _THRESHOLD_GROUP]}
                part = calibrator.compute_data()
                data.update(part.data)
                method = part.calibration_method
                now = time.perf_counter()
                if now - last >= PROGRESS_SECONDS and len(data) < len(names):
                    last = now
                    _logger.info(
                        "Calibrating %s: thresholds of %d / %d tensors, %.1f s",
                        range_estimator, len(data), len(names), now - start,
                    )
        finally:
            collector.histogram_dict = every
    return TensorsData(method, data)


class Quantizer:
    """Builds int8 models of one fp32 model: static QDQ from cached calibration, or dynamic.

    Args:
        model: The model to quantize (the prepared one, see
            :func:`optuna_quant.quantization.prepare.prepare_model`), or its serialized bytes when the caller
            has them already: serializing a large model takes seconds.
        calibration_feeds: Input dicts to calibrate on, fed to the calibrators one at a time.
        shapes_inferred: ``model`` holds ONNX shape inference's value_info already
            (:attr:`optuna_quant.quantization.prepare.PreparedModel.shapes_inferred`): it is
            not inferred again, and not written to a file before a calibration needs one.
        expected_outputs: The fp32 outputs on the first calibration feeds that a recovery
            transform must keep (:attr:`optuna_quant.quantization.prepare.PreparedModel.outputs`);
            default ``model``'s own, computed when a transform is first asked for.

    Attributes:
        calibration_seconds: Time spent calibrating so far, by calibration family.
        unbounded: The tensors left out of calibration (:func:`unbounded_tensors`), known once
            MinMax ran (every calibration runs it first).
        kept_fp32: The nodes that read or write them, fp32 in every configuration.
        transform_seconds: Time spent on each set of recovery transforms (applied, checked), by
            their names joined with ``+``.
    """

    def __init__(
        self,
        model: onnx.ModelProto | bytes,
        calibration_feeds: Sequence[Feed],
        *,
        shapes_inferred: bool = False,
        expected_outputs: Sequence[Sequence[np.ndarray]] = (),
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="optuna-quant-")
        self._path = Path(self._tmp.name) / "model.onnx"
        # The quantizer needs value_info for every tensor; load once, copy per trial.
        if shapes_inferred:
            self._model = onnx.load_from_string(model) if isinstance(model, bytes) else copy.deepcopy(model)
            add_infer_metadata(self._model)  # what onnxruntime's quantizers check before inferring again
        else:
            self._path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
            self._model = load_model_with_shape_infer(self._path)
        self._feeds = list(calibration_feeds)
        # Only the percentile histogram serves again (each percentile is computed from it); a
        # calibrator holds a copy of the model and a session, so the others are not kept.
        self._histogram: CalibraterBase | None = None
        self._ranges: dict[str, TensorsData] = {}
        self.calibration_seconds: dict[str, float] = {}
        self.unbounded: tuple[str, ...] = ()
        self.kept_fp32: tuple[str, ...] = ()
        self._expected = list(expected_outputs)
        # Each set of recovery transforms is a model of its own, with calibrations of its own.
        self._transformed: dict[frozenset[str], Quantizer] = {}
        self._refused: dict[frozenset[str], str] = {}  # checked once: a transform that failed fails again at once
        self.transform_seconds: dict[str, float] = {}

    @property
    def model_path(self) -> Path:
        """The model's file, which onnxruntime's calibrators read; written when first asked for."""
        if not self._path.exists():
            self._path.write_bytes(self._model.SerializeToString())
        return self._path

    def ranges(self, range_estimator: str) -> TensorsData:
        """The activation ranges of ``range_estimator``, computed at most once, without the
        :attr:`unbounded` tensors."""
        if range_estimator not in self._ranges:
            method, options = _family(range_estimator)
            percentile = _percentile(range_estimator)
            calibrator = self._histogram if percentile is not None else None
            minmax = None
            if calibrator is None and method is not CalibrationMethod.MinMax:
                minmax = self.ranges("minmax")  # histograms start over these; timed as MinMax's
            start = time.perf_counter()
            if calibrator is None:
                calibrator = create_calibrator(
                    self.model_path,
                    augmented_model_path=str(Path(self._tmp.name) / f"augmented_{method.name}.onnx"),
                    calibrate_method=method,
                    extra_options=options,
                )
                if minmax is not None:
                    calibrator.tensors_to_calibrate &= set(minmax.data)  # no histogram spans a fill
                    seed_histograms(calibrator, minmax)
                collect(calibrator, self._feeds, method.name)
            if percentile is not None:
                self._histogram = calibrator
                calibrator.collector.percentile = percentile
            ranges = compute(calibrator, range_estimator)
            if method is CalibrationMethod.MinMax:
                ranges = self._bounded(ranges)
            self._ranges[range_estimator] = ranges
            seconds = time.perf_counter() - start
            self.calibration_seconds[method.name] = self.calibration_seconds.get(method.name, 0.0) + seconds
            _logger.info("Calibrated %s in %.2f s", range_estimator, seconds)
        return self._ranges[range_estimator]

    def _bounded(self, minmax: TensorsData) -> TensorsData:
        """``minmax`` without its unbounded tensors, which it records, with the nodes around them."""
        self.unbounded = unbounded_tensors(minmax)
        self.kept_fp32 = nodes_around(self._model, self.unbounded)
        if self.unbounded:
            _logger.info(
                "Calibration leaves out %d tensors whose values are not finite or are fills (attention masks, "
                "-inf paddings): %s; the %d nodes that read or write them stay fp32: %s",
                len(self.unbounded),
                _listed(self.unbounded),
                len(self.kept_fp32),
                _listed(self.kept_fp32),
            )
        kept = {name: data for name, data in minmax.data.items() if name not in self.unbounded}
        return TensorsData(minmax.calibration_method, kept)

    def calibration_reader(self) -> CalibrationDataReader:
        """A fresh onnxruntime reader over the calibration feeds (one pass each)."""
        return _FeedReader(self._feeds)

    def transformed(self, recovery: frozenset[str]) -> Quantizer:
        """The quantizer of the model with the recovery transforms ``recovery`` applied, built
        and checked once (a failed check is not run again).

        Raises:
            ValueError: If a transform is unknown or changes the fp32 outputs beyond
                :data:`optuna_quant.quantization.prepare.RTOL` of the expected ones.
        """
        if recovery in self._refused:
            raise ValueError(self._refused[recovery])
        if recovery not in self._transformed:
            names = "+".join(sorted(recovery))
            start = time.perf_counter()
            transformed = apply_transforms(self._model, recovery)
            checks = self._feeds[:CHECK_FEEDS]
            if not self._expected:
                self._expected = run_feeds(check_session(self._model), checks)
            mismatch = output_mismatch(transformed, checks[: len(self._expected)], self._expected)
            if mismatch:
                self._refused[recovery] = f"The recovery transform {names} changes what the fp32 model computes: {mismatch}."
                raise ValueError(self._refused[recovery])
            quantizer = Quantizer(transformed, self._feeds, shapes_inferred=True, expected_outputs=self._expected)
            seconds = time.perf_counter() - start
            self.transform_seconds[names] = seconds
            _logger.info("Applied %s to the fp32 model in %.2f s, its outputs checked on %d feeds", names, seconds, len(checks))
            self._transformed[recovery] = quantizer
        return self._transformed[recovery]

    def quantize(self, config: QuantConfig) -> onnx.ModelProto:
        """The int8 model of ``config``: static Q/DQ, where the nodes around :attr:`unbounded`
        tensors stay fp32, or dynamic (:func:`~optuna_quant.quantization.dynamic.dynamic_model`,
        no calibration); of the model with ``config.recovery``'s transforms applied
        (:meth:`transformed`).

        Raises:
            ValueError: If a recovery transform changes the fp32 outputs (:meth:`transformed`).
        """
        if config.recovery:
            return self.transformed(config.recovery).quantize(replace(config, recovery=frozenset()))
        if config.approach == "dynamic":
            return dynamic_model(self._model, config)
        ranges = self.ranges(config.range_estimator)
        return qdq_model(self._model, ranges, config, keep_fp32=self.kept_fp32)
