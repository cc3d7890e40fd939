"""Static QDQ quantization with onnxruntime, calibrating once per method and reusing the ranges.

onnxruntime's ``quantize_static`` calibrates on every call. Here the activation ranges of each
calibration family are collected once (MinMax, Entropy, and one histogram shared by every
percentile), so that a trial that only changes fallback, granularity or symmetry runs no
calibration, and a new percentile costs a single ``compute_data()`` call.

Example:
    >>> quantizer = Quantizer(model, feeds)                     # doctest: +SKIP
    >>> int8 = quantizer.quantize(QuantConfig(fallback=frozenset({"fc"})))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import contextlib
import copy
import io
import logging
from pathlib import Path
import tempfile
import time

import onnx
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization import QuantType
from onnxruntime.quantization.calibrate import create_calibrator
from onnxruntime.quantization.calibrate import TensorsData
from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
from onnxruntime.quantization.quant_utils import load_model_with_shape_infer
from onnxruntime.quantization.registry import QDQRegistry

from optuna_quant.model_io import Feed
from optuna_quant.space import QuantConfig

_logger = logging.getLogger(__name__)

# onnxruntime's default of 128 bins equals num_quantized_bins and leaves Entropy a single
# candidate threshold, i.e. exactly the MinMax ranges (DESIGN.md section 7).
ENTROPY_NUM_BINS = 2048


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


def _percentile(range_estimator: str) -> float | None:
    if range_estimator.startswith("percentile_"):
        return float(range_estimator.removeprefix("percentile_"))
    return None


class Quantizer:
    """Builds int8 QDQ models of one fp32 model from cached calibration.

    Args:
        model: The fp32 model (checked, with named nodes: see
            :func:`optuna_quant.model_io.load_model`), or its serialized bytes when the caller
            has them already: serializing a large model takes seconds.
        calibration_feeds: Input dicts to calibrate on.

    Attributes:
        calibration_seconds: Time spent calibrating so far, by calibration family.
    """

    def __init__(self, model: onnx.ModelProto | bytes, calibration_feeds: Sequence[Feed]) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="optuna-quant-")
        self.model_path = Path(self._tmp.name) / "model.onnx"
        self.model_path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
        # The quantizer needs value_info for every tensor; load once, copy per trial.
        self._model = load_model_with_shape_infer(self.model_path)
        self._feeds = list(calibration_feeds)
        # Only the percentile histogram serves again (each percentile is computed from it); a
        # calibrator holds a copy of the model and a session, so the others are not kept.
        self._histogram: object | None = None
        self._ranges: dict[str, TensorsData] = {}
        self.calibration_seconds: dict[str, float] = {}

    def ranges(self, range_estimator: str) -> TensorsData:
        """The activation ranges of ``range_estimator``, computed at most once."""
        if range_estimator not in self._ranges:
            method, options = _family(range_estimator)
            percentile = _percentile(range_estimator)
            calibrator = self._histogram if percentile is not None else None
            start = time.perf_counter()
            if calibrator is None:
                calibrator = create_calibrator(
                    self.model_path,
                    augmented_model_path=str(Path(self._tmp.name) / f"augmented_{method.name}.onnx"),
                    calibrate_method=method,
                    extra_options=options,
                )
                with contextlib.redirect_stdout(io.StringIO()):
                    calibrator.collect_data(self.calibration_reader())
            if percentile is not None:
                self._histogram = calibrator
                calibrator.collector.percentile = percentile
            # onnxruntime prints progress on stdout; keep the tuner's output to its log lines.
            with contextlib.redirect_stdout(io.StringIO()):
                self._ranges[range_estimator] = calibrator.compute_data()
            seconds = time.perf_counter() - start
            self.calibration_seconds[method.name] = self.calibration_seconds.get(method.name, 0.0) + seconds
            _logger.debug("Calibrated %s in %.3f s", range_estimator, seconds)
        return self._ranges[range_estimator]

    def calibration_reader(self) -> CalibrationDataReader:
        """A fresh onnxruntime reader over the calibration feeds (one pass each)."""
        return _FeedReader(self._feeds)

    def quantize(self, config: QuantConfig) -> onnx.ModelProto:
        """The int8 QDQ model of ``config``."""
        ranges = self.ranges(config.range_estimator)
        # QDQQuantizer rewrites both the model and the ranges it is given: hand it copies.
        quantizer = QDQQuantizer(
            copy.deepcopy(self._model),
            config.per_channel,
            False,
            QuantType.QInt8,
            QuantType.QUInt8,
            copy.deepcopy(ranges),
            None,
            sorted(config.fallback),
            list(QDQRegistry),
            {"ActivationSymmetric": config.symmetric, "WeightSymmetric": config.symmetric},
        )
        quantizer.quantize_model()
        return quantizer.model.model
