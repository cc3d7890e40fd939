"""One fp32 model's int8 configurations, built and measured against it: no Optuna here.

A :class:`Measurer` loads and prepares the model once, calibrates on demand (each calibration
method once, :class:`optuna_quant.quantization.quantize.Quantizer`), and measures a configuration
as the study scores it: ``eval_fn`` on the int8 model, its relative accuracy loss against the
fp32 baseline, and the paired fp32/int8 latency (:func:`optuna_quant.measure.latency.steady_latency`).

Example:
    >>> measurer = Measurer("model.onnx", calib, eval_fn)                    # doctest: +SKIP
    >>> m = measurer.measure(QuantConfig(fallback=frozenset({"fc"})))          # doctest: +SKIP
    >>> m.acc_loss, m.lat_diff                                                 # doctest: +SKIP
    (0.0021, 1.84)
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait
from dataclasses import dataclass
import hashlib
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from optuna_quant.measure.cpu import int8_support
from optuna_quant.measure.evaluate import accepts_subset_size
from optuna_quant.measure.evaluate import checked_score
from optuna_quant.measure.evaluate import EvalFn
from optuna_quant.measure.evaluate import SampleScores
from optuna_quant.measure.int8_causes import int8_nodes
from optuna_quant.measure.int8_causes import quantizes_anything
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.latency import feed_shapes
from optuna_quant.measure.latency import LatencyResult
from optuna_quant.measure.latency import steady_latency
from optuna_quant.measure.loss import relative_accuracy_loss
from optuna_quant.measure.paired import acc_loss_lower_bound
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.model_io import batch_of
from optuna_quant.quantization.model_io import Feed
from optuna_quant.quantization.model_io import load_checked
from optuna_quant.quantization.model_io import ModelLike
from optuna_quant.quantization.model_io import to_feed
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import Quantizer


TimingWatch = Callable[[float, float, bool], bool]
"""Called after each timed block with the model's ``acc_loss``, that block's ``lat_diff`` and
whether the model quantizes anything; ``True`` stops the timing (``latency.stopped``)."""
FP32_THREAD = "optuna-quant-fp32"
"""The name of the thread that scores the fp32 model beside preparation (``fp32_alongside``)."""
AccuracyWatch = Callable[[float], bool]
"""Called after each batch of an evaluation by samples with the lower confidence bound of the
``acc_loss`` so far (:func:`optuna_quant.measure.paired.acc_loss_lower_bound`); ``True`` stops
the evaluation there (``Measurement.eval_samples``)."""

@dataclass(frozen=True)
class Measurement:
    """What one configuration measured.

    Attributes:
        accuracy: The int8 model's score from ``eval_fn``.
        acc_loss: Relative accuracy loss against fp32.
        latency: The paired latency measurement.
        quantize_seconds: Time to build the int8 model (calibration included, if any ran).
        eval_seconds: Time spent in ``eval_fn``.
        latency_seconds: Time spent timing.
        quantized: Whether the model runs anything in int8; a configuration that keeps every
            quantizable node in fp32 builds the fp32 model, which meets no target.
        eval_samples: Where an :data:`AccuracyWatch` stopped the evaluation, the samples scored:
            ``accuracy`` and ``acc_loss`` are then estimated from them, paired with fp32's.
    """

    accuracy: float
    acc_loss: float
    latency: LatencyResult
    quantize_seconds: float
    eval_seconds: float
    latency_seconds: float
    quantized: bool = True
    eval_samples: int | None = None

    @property
    def lat_diff(self) -> float:
        """``fp32_latency / int8_latency``."""
        return self.latency.lat_diff

    def user_attrs(self) -> dict[str, float | int | bool]:
        """The trial user attrs that record this measurement."""
        return {
            "acc_loss": self.acc_loss,
            "lat_diff": self.lat_diff,
            "accuracy": self.accuracy,
            "fp32_latency_ms": self.latency.fp32_ms,
            "int8_latency_ms": self.latency.int8_ms,
            "lat_diff_spread": self.latency.spread,
            "lat_retimed": self.latency.retimed,
            "lat_contended": self.latency.contended,
            "latency_feed": self.latency.feed,
            "quantize_s": self.quantize_seconds,
            "eval_s": self.eval_seconds,
            "latency_s": self.latency_seconds,
            "lat_blocks": self.latency.blocks,
            "quantized": self.quantized,
            **({} if self.eval_samples is None else {"eval_samples": self.eval_samples}),
        }


def _checked_subset_size(eval_fn: EvalFn, eval_subset_size: int | None) -> None:
    if eval_subset_size is None:
        return
    if isinstance(eval_subset_size, bool) or not isinstance(eval_subset_size, int) or eval_subset_size < 1:
        raise ValueError(f"eval_subset_size must be a positive integer, got {eval_subset_size!r}.")
    if not accepts_subset_size(eval_fn):
        raise ValueError(
            "eval_subset_size is set but eval_fn takes no 'subset_size' keyword; add one, or use optuna_quant.Top1Accuracy."
        )


class Measurer:
    """Builds, evaluates and times the int8 configurations of one fp32 model.

    Args:
        model: An ONNX model: a path or an ``onnx.ModelProto``.
        calibration_data: Iterable of ``{input_name: array}`` (or arrays, for a single input).
        eval_fn: ``eval_fn(session) -> float``, higher is better. It may take ``subset_size``.
        benchmark: How latency is measured.
        fp32_accuracy: The fp32 baseline (POT's ``metrics``); skips the fp32 evaluation.
        eval_subset_size: Evaluate every model on the first N samples only.
        pre_process: Prepare the model with onnxruntime's ``quant_pre_process`` before quantizing,
            and its transformer optimizer after it with ``"transformer"``
            (:mod:`optuna_quant.quantization.prepare`); fp32 accuracy and latency are measured on
            the model as given, so ``lat_diff`` is the speed-up the user gets.
        latency_data: The input to time every model on, as the model will run (a
            ``{input_name: array}`` dict, or an array for a single input): the batch and sequence
            length of production, say. Default: the first ``benchmark.batch_size`` samples of
            the calibration data.
        fp32_alongside: Score the fp32 model (``eval_fn``, in a thread of its own) while the
            model is prepared, for a caller whose first trial needs the score: both take
            seconds on a large model and neither waits for the other. :meth:`baseline` takes
            the score; :meth:`adopt_baseline` and :meth:`wait_for_baseline` wait for it to end,
            so that nothing runs beside a timing. Ignored where ``fp32_accuracy`` is given.

    Attributes:
        model: The model as given, the fp32 baseline.
        prepared: The model that is quantized, with what preparation did.
        feeds: The calibration feeds.
        latency_feed: The input every timing runs on: ``latency_data``, or ``benchmark.batch_size``
            rows of the calibration data.
        quantizer: Builds the int8 models from cached calibration.
        fingerprint: The SHA-256 of the model as given, which a shared study checks.
        cpu: What this machine offers for int8; a study's trials all come from one int8 class.

    Raises:
        FileNotFoundError, TypeError, ValueError: For a bad model, calibration data or setting;
            raised here, before anything is measured: ``latency_data`` is checked against the
            model's inputs (names, ranks, fixed sizes, dtypes) and run once through it.
    """

    def __init__(
        self,
        model: ModelLike,
        calibration_data: Iterable[Any],
        eval_fn: EvalFn,
        *,
        benchmark: BenchmarkSettings | None = None,
        fp32_accuracy: float | None = None,
        eval_subset_size: int | None = None,
        pre_process: bool | str = True,
        latency_data: Any = None,
        fp32_alongside: bool = False,
    ) -> None:
        if not callable(eval_fn):
            raise TypeError(f"eval_fn must be callable, got {eval_fn!r}.")
        _checked_subset_size(eval_fn, eval_subset_size)
        self.eval_fn = eval_fn
        self.eval_subset_size = eval_subset_size
        self.benchmark = benchmark or BenchmarkSettings()
        self._fp32_accuracy = None if fp32_accuracy is None else checked_score(fp32_accuracy, "metrics")
        loaded = load_checked(model)
        self.model = loaded.proto
        self.feeds = to_feeds(calibration_data, self.model)
        try:
            self._fp32_session = self._session(loaded.serialized)
        except Exception as err:  # the checker passes graphs that onnxruntime refuses to load
            raise ValueError(f"onnxruntime cannot load the model: {err}") from err
        self.latency_feed = self._latency_feed(latency_data)
        self._fp32_sample_scores: np.ndarray | None = None
        if latency_data is not None:
            try:
                self._fp32_session.run(None, self.latency_feed)
            except Exception as err:
                raise ValueError(
                    f"The model does not run on latency_data ({feed_shapes(self.latency_feed)}): {err}"
                ) from err
        # After the checks of the input, so that bad input starts no evaluation; an onnxruntime
        # session runs from several threads at once, so preparation's output checks share it.
        self._fp32_scoring: Future[float] | None = None
        if fp32_alongside and self._fp32_accuracy is None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=FP32_THREAD)
            self._fp32_scoring = pool.submit(self._evaluate, self._fp32_session, "fp32")
            pool.shutdown(wait=False)  # its thread ends with its one evaluation
        self.prepared = prepare_model(loaded, self.feeds, pre_process=pre_process, session=self._fp32_session)
        self.quantizer = Quantizer(
            self.prepared.prepared,
            self.feeds,
            shapes_inferred=self.prepared.shapes_inferred,
            expected_outputs=self.prepared.outputs,
        )
        self._given_int8_nodes = int8_nodes(self.prepared.prepared)
        self.fingerprint = hashlib.sha256(loaded.serialized).hexdigest()
        self.cpu = int8_support()

    def _latency_feed(self, latency_data: Any) -> Feed:
        if latency_data is None:
            try:
                return batch_of(self.feeds, self.benchmark.batch_size)
            except ValueError as err:
                raise ValueError(f"benchmark.batch_size: {err} (calibration_data)") from err
        if self.benchmark.batch_size != BenchmarkSettings().batch_size:
            raise ValueError(
                "latency_data and benchmark.batch_size both say what to time on: give one "
                "(latency_data holds its own batch)."
            )
        return to_feed(latency_data, self.model, "latency_data")

    def _session(self, model: onnx.ModelProto | bytes) -> ort.InferenceSession:
        serialized = model if isinstance(model, bytes) else model.SerializeToString()
        return ort.InferenceSession(serialized, self.benchmark.session_options(), providers=["CPUExecutionProvider"])

    def _evaluate(self, session: ort.InferenceSession, what: str) -> float:
        kwargs = {} if self.eval_subset_size is None else {"subset_size": self.eval_subset_size}
        try:
            value = self.eval_fn(session, **kwargs)
        except Exception as err:
            raise RuntimeError(f"eval_fn raised on the {what} model: {err!r}") from err
        return checked_score(value, f"eval_fn on the {what} model")

    def _sample_scores(self, session: ort.InferenceSession, what: str) -> Iterator[np.ndarray]:
        assert isinstance(self.eval_fn, SampleScores)
        kwargs = {} if self.eval_subset_size is None else {"subset_size": self.eval_subset_size}
        batches = iter(self.eval_fn.sample_scores(session, **kwargs))
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception as err:
                raise RuntimeError(f"eval_fn raised on the {what} model: {err!r}") from err
            yield np.asarray(batch, dtype=np.float64).ravel()

    def _fp32_scores(self) -> np.ndarray:
        if self._fp32_sample_scores is None:  # once, on the first evaluation by samples
            self._fp32_sample_scores = np.concatenate(list(self._sample_scores(self._fp32_session, "fp32")))
        return self._fp32_sample_scores

    def _evaluate_watched(self, session: ort.InferenceSession, watch: AccuracyWatch) -> tuple[float, int | None]:
        """The int8 score by samples, or its estimate where ``watch`` stopped it, with the samples scored then."""
        fp32, fp32_accuracy = self._fp32_scores(), self.baseline()
        scores = np.empty(0)
        for batch in self._sample_scores(session, "int8"):
            scores = np.concatenate([scores, batch])
            if len(scores) > len(fp32):
                break
            if len(scores) < len(fp32) and watch(acc_loss_lower_bound(fp32, scores, fp32_accuracy)):
                return fp32_accuracy - float(np.mean(fp32[: len(scores)] - scores)), len(scores)
        if len(scores) != len(fp32):
            raise ValueError(
                f"eval_fn.sample_scores scored {len(scores)} samples of the int8 model and {len(fp32)} of "
                "the fp32 model: it must score the same samples every call."
            )
        return checked_score(float(np.mean(scores)), "eval_fn on the int8 model"), None

    def build(self, config: QuantConfig) -> onnx.ModelProto:
        """The int8 model of ``config``, from cached calibration."""
        return self.quantizer.quantize(config)

    def quantizes(self, int8_model: onnx.ModelProto) -> bool:
        """Whether ``int8_model``, built here, runs anything in int8 that the prepared model does not."""
        return quantizes_anything(int8_model, self._given_int8_nodes)

    def accuracy(self, config: QuantConfig) -> float:
        """The int8 score of ``config``, without timing it."""
        return self._evaluate(self._session(self.build(config)), "int8")

    def measure(
        self, config: QuantConfig, watch: TimingWatch | None = None, accuracy_watch: AccuracyWatch | None = None
    ) -> Measurement:
        """Build, evaluate and time ``config``; the watchers may stop the timing
        (:data:`TimingWatch`) and the evaluation (:data:`AccuracyWatch`).

        Raises:
            RuntimeError: If ``eval_fn`` raises or returns something other than a finite number.
        """
        start = time.perf_counter()
        int8_model = self.build(config)
        return self.measure_model(
            int8_model, quantize_seconds=time.perf_counter() - start, watch=watch, accuracy_watch=accuracy_watch
        )

    def measure_model(
        self,
        int8_model: onnx.ModelProto,
        *,
        quantize_seconds: float = 0.0,
        watch: TimingWatch | None = None,
        accuracy_watch: AccuracyWatch | None = None,
    ) -> Measurement:
        """Evaluate and time a ready int8 model exactly as :meth:`measure` does a configuration.

        For a model that is no configuration of the search space, such as a QAT export: the same
        ``eval_fn``, fp32 baseline and paired latency timing make its figures comparable.

        Args:
            int8_model: The quantized model; it takes the same inputs as the fp32 model.
            quantize_seconds: Time already spent building ``int8_model``. Creating its
                onnxruntime session is added, as it is for a configuration.
            watch: Sees each timed block and may stop the timing (:data:`TimingWatch`).
            accuracy_watch: Sees the bound of the accuracy loss after each batch and may stop
                the evaluation (:data:`AccuracyWatch`), where ``eval_fn`` scores by samples
                (:class:`~optuna_quant.measure.evaluate.SampleScores`); otherwise unused.

        Raises:
            RuntimeError: If ``eval_fn`` raises or returns something other than a finite number.
        """
        fp32_accuracy = self.baseline()
        start = time.perf_counter()
        int8 = self._session(int8_model)
        built = time.perf_counter()
        eval_samples = None
        if accuracy_watch is not None and isinstance(self.eval_fn, SampleScores):
            accuracy, eval_samples = self._evaluate_watched(int8, accuracy_watch)
        else:
            accuracy = self._evaluate(int8, "int8")
        evaluated = time.perf_counter()
        acc_loss = relative_accuracy_loss(fp32_accuracy, accuracy)
        quantized = self.quantizes(int8_model)
        on_block = None if watch is None else lambda ratio: watch(acc_loss, ratio, quantized)
        latency = steady_latency(self._fp32_session, int8, self.latency_feed, self.benchmark, on_block)
        return Measurement(
            accuracy=accuracy,
            acc_loss=acc_loss,
            latency=latency,
            quantize_seconds=quantize_seconds + built - start,
            eval_seconds=evaluated - built,
            latency_seconds=time.perf_counter() - evaluated,
            quantized=quantized,
            eval_samples=eval_samples,
        )

    def baseline(self) -> float:
        """The fp32 accuracy: from ``metrics``, or measured once.

        Raises:
            RuntimeError: If ``eval_fn`` fails on the fp32 model.
            ValueError: If it scores the fp32 model 0, for which no relative loss exists.
        """
        if self._fp32_accuracy is None:
            scoring, self._fp32_scoring = self._fp32_scoring, None
            accuracy = self._evaluate(self._fp32_session, "fp32") if scoring is None else scoring.result()
            if accuracy == 0:
                raise ValueError("eval_fn scores the fp32 model 0: a relative accuracy loss is undefined.")
            self._fp32_accuracy = accuracy
        return self._fp32_accuracy

    def adopt_baseline(self, fp32_accuracy: float) -> None:
        """Use the fp32 accuracy a study stored, so that every worker scores against the same one."""
        self.wait_for_baseline()
        self._fp32_accuracy = fp32_accuracy

    def wait_for_baseline(self) -> None:
        """Wait until the fp32 score begun alongside preparation (``fp32_alongside``) has ended,
        if it has not; what it raised is raised by :meth:`baseline`, not here."""
        if self._fp32_scoring is not None:
            wait([self._fp32_scoring])
