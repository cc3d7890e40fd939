"""Per-layer sensitivity: what int8 costs each searchable layer in accuracy, and what it saves in time.

Measured once per study, before the search, on calibration data:

- **Accuracy**: the error of the final outputs against the fp32 model, as a noise-to-signal ratio
  summed over the outputs (:func:`output_error`); quantization noise of independent layers adds
  up in it. Per layer: the error with only that layer int8 (``error_alone``) and the error that
  keeping only it in fp32 removes from the all-int8 model (``error_recovered``).
- **Time**: short paired timings end to end, of the all-int8 model against it with the layer in
  fp32 (``revert_cost``) and of the fp32 model against it with only the layer in int8
  (``alone_speedup``), beside the profiler's per-layer node time (:mod:`.profile`).
- **The other parameters**: the all-int8 output error of each of their combinations
  (:func:`measure_scope_errors`), and the all-int8 speed-up of each set of kernels they build
  (:func:`measure_kernel_speed`); the layers are measured at the combination the prior rates highest
  (:func:`optuna_quant.trial.scoring.base_combination`).

Example:
    >>> sens = measure_sensitivity(model, quantizer, feeds, ["conv1", "fc"])   # doctest: +SKIP
    >>> sens["fc"].error_alone, sens["fc"].revert_cost                          # doctest: +SKIP
    (0.0012, 0.08)
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import replace
import logging
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.latency import measure_latency
from optuna_quant.measure.profile import initializers_of
from optuna_quant.measure.profile import profile_layers
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.config import quantizable_nodes
from optuna_quant.quantization.config import RANGE_ESTIMATORS
from optuna_quant.quantization.model_io import Feed
from optuna_quant.quantization.quantize import Quantizer


_logger = logging.getLogger(__name__)

REVERT_TIMING = BenchmarkSettings(threads=1, warmup=5, blocks=6, min_seconds=0.3)
"""The short paired timing of each revert (about 0.3 s of runs per layer, plus its session)."""
KERNEL_TIMING_ROUNDS = 3
"""Rounds in which :func:`measure_kernel_speed` times every set of kernels once."""
KERNEL_ERROR_SPAN = 10.0
"""Sets of kernels whose all-int8 error is over this many times the lowest are not timed: the
prior scores their choices at its floor whatever their speed."""

ScopeError = dict[str, Any]
"""``{"params": {name: choice}, "error": float, "lat_diff": float}``: the all-int8 output error of
one combination and, where timed, the all-int8 model's speed-up over fp32;
``{"params": ..., "error": None, "failure": "<exception type>: <message>"}`` for one that failed
to build or run."""


@dataclass(frozen=True)
class LayerSensitivity:
    """How much one layer's int8 costs and saves.

    Attributes:
        error_alone: Output noise-to-signal ratio when only this layer of the searched ones is int8.
        error_recovered: Output noise-to-signal ratio that keeping only this layer in fp32 removes
            from the all-int8 model (negative when it adds some).
        fp32_ms: This layer's profiled node time in the fp32 model, per run, in milliseconds.
        int8_ms: This layer's profiled node time in the all-int8 model (its int8 kernel and the
            Q/DQ named after it), per run, in milliseconds.
        revert_cost: The share of the all-int8 model's speed-up that keeping only this layer in
            fp32 loses, timed end to end: ``1 - t_all_int8 / t_reverted`` (negative when the
            revert is faster); ``None`` when not measured (a measurement stored before it was).
        alone_speedup: The speed-up of the model with only this layer of the searched ones in
            int8 over the fp32 model, timed end to end: ``t_fp32 / t_alone`` (above 1 when this
            layer's int8 pays on its own); ``None`` when not measured. It and ``revert_cost``
            can disagree: reverting one layer of an all-int8 model adds the Q/DQ around it,
            quantizing one layer of an fp32 model adds them too: on mtcnn_onet the first two
            convolutions cost much when reverted alone, every convolution slows the fp32 model
            or ties it when quantized alone, and the fastest configuration keeps all four in fp32.
    """

    error_alone: float
    error_recovered: float
    fp32_ms: float
    int8_ms: float
    revert_cost: float | None = None
    alone_speedup: float | None = None

    @property
    def acc_cost(self) -> float:
        """What int8 costs this layer in accuracy: :attr:`error_alone` (the better predictor)."""
        return self.error_alone

    @property
    def time_saved_ms(self) -> float:
        """Profiled time int8 saves on this layer per run (negative when it is slower than fp32)."""
        return self.fp32_ms - self.int8_ms

    def to_dict(self) -> dict[str, float | None]:
        """The measurement as a JSON-serialisable dict (a study user attr)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerSensitivity:
        """The measurement stored by :meth:`to_dict` (``revert_cost`` and ``alone_speedup`` may
        be absent).

        Example:
            >>> LayerSensitivity.from_dict({"error_alone": 0.1, "error_recovered": 0.1, "fp32_ms": 1, "int8_ms": 0.5})
            LayerSensitivity(error_alone=0.1, error_recovered=0.1, fp32_ms=1.0, int8_ms=0.5, revert_cost=None, alone_speedup=None)
        """
        optional = {key: None if data.get(key) is None else float(data[key]) for key in ("revert_cost", "alone_speedup")}
        return cls(**{key: float(data[key]) for key in ("error_alone", "error_recovered", "fp32_ms", "int8_ms")}, **optional)


def failure_reason(err: BaseException) -> str:
    """How a failure is recorded: ``"<exception type>: <message>"``, on one line.

    Example:
        >>> failure_reason(ValueError("supplied range\\nis not finite"))
        'ValueError: supplied range is not finite'
    """
    return " ".join(f"{type(err).__name__}: {err}".split())


def output_error(reference: Sequence[Sequence[np.ndarray]], outputs: Sequence[Sequence[np.ndarray]]) -> float:
    """Noise-to-signal ratio of ``outputs`` against ``reference``: ``sum ||y - y_ref||^2 / sum ||y_ref||^2``.

    Both are lists (one item per sample) of the model's outputs.

    Example:
        >>> output_error([[np.array([3.0, 4.0])]], [[np.array([3.0, 3.0])]])
        0.04
    """
    pairs = [
        (np.asarray(y, np.float64), np.asarray(r, np.float64))
        for ys, rs in zip(outputs, reference)
        for y, r in zip(ys, rs)
    ]
    noise = sum(float(np.sum((y - r) ** 2)) for y, r in pairs)
    signal = sum(float(np.sum(r**2)) for _, r in pairs)
    return noise / signal if signal > 0 else noise


def _session(model: onnx.ModelProto | bytes, settings: BenchmarkSettings) -> ort.InferenceSession:
    source = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(source, settings.session_options(), providers=["CPUExecutionProvider"])


def model_outputs(model: onnx.ModelProto, samples: Sequence[Feed], settings: BenchmarkSettings) -> list[list[np.ndarray]]:
    """``model``'s outputs on each of ``samples``, in one session on ``settings``' threads."""
    session = _session(model, settings)
    return [session.run(None, feed) for feed in samples]


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def measure_sensitivity(
    fp32_model: onnx.ModelProto,
    quantizer: Quantizer,
    feeds: Sequence[Feed],
    nodes: Sequence[str] | Mapping[str, Sequence[str]],
    *,
    base_config: QuantConfig | None = None,
    n_samples: int = 32,
    profile_runs: int = 20,
    settings: BenchmarkSettings | None = None,
    revert_timing: BenchmarkSettings | None = REVERT_TIMING,
    timing_feed: Feed | None = None,
    fp32_outputs: Sequence[Sequence[np.ndarray]] | None = None,
) -> dict[str, LayerSensitivity]:
    """Measure every layer of ``nodes`` once: its accuracy cost and what int8 saves on it.

    A group of layers (``nodes`` a mapping) is measured as one layer: its nodes reverted
    together, alone in int8 together, its node time their sum.

    Costs ``2 n + 2`` quantized models' output errors on ``n_samples`` feeds, two profiles, and
    ``2 n`` short paired timings (``revert_timing``: about 0.3 s of runs and one session each by
    default; the log line gives their time).

    Args:
        fp32_model: The fp32 model that ``quantizer`` quantizes.
        quantizer: Builds the int8 models (cached calibration).
        feeds: Input dicts; the first ``n_samples`` measure the output error.
        nodes: The searchable layers, or groups of them by name (``{group: nodes}``); the
            others keep ``base_config``'s choice throughout.
        base_config: The all-int8 configuration (default :class:`QuantConfig`; best measured at
            the lowest-error combination of :func:`measure_scope_errors`).
        n_samples: Feeds on which the output error is measured.
        profile_runs: Profiled runs of each of the fp32 and the all-int8 models.
        settings: Threads for every session (default :class:`BenchmarkSettings`).
        revert_timing: The paired timing of each revert (:attr:`LayerSensitivity.revert_cost`)
            and of each layer alone in int8 (:attr:`LayerSensitivity.alone_speedup`), on
            ``settings``' threads; ``None`` leaves both unmeasured.
        timing_feed: The input that is profiled and timed (default: the first feed). Give the
            one the study times its trials on: what a layer's int8 saves depends on the input's
            size (silero-vad's output layer: its revert reads 0 % to +0.6 % on a calibration
            feed of 187 rows, and -4 % to -6 %, a revert that speeds the model up, on the one row
            its study times; ``benchmarks/real_models/layer_timing.py``).
        fp32_outputs: The fp32 model's outputs on the first ``n_samples`` feeds
            (:func:`model_outputs`), when measured already.

    Returns:
        The sensitivity of each layer (or group), by name, in the order of ``nodes``.

    Raises:
        ValueError: If ``nodes`` is empty, names a node the model lacks, or ``n_samples`` or
            ``profile_runs`` is not positive; raised before any measurement.
    """
    base = base_config or QuantConfig()
    settings = settings or BenchmarkSettings()
    units = dict(nodes) if isinstance(nodes, Mapping) else {node: (node,) for node in nodes}
    every = {node for members in units.values() for node in members}
    names = [n.name for n in fp32_model.graph.node]
    missing = sorted(every - set(names))
    if not every or missing:
        raise ValueError(f"nodes must name nodes of the model; missing: {missing or 'all (none given)'}.")
    _check_positive(n_samples=n_samples, profile_runs=profile_runs)
    samples = list(feeds[:n_samples])
    timed = samples[0] if timing_feed is None else timing_feed
    _logger.info(
        "Measuring the sensitivity of %d layers on %d samples, timed on a batch of %d",
        len(units),
        len(samples),
        len(next(iter(timed.values()))),
    )
    start = time.perf_counter()

    def with_fallback(fallback: Iterable[str]) -> onnx.ModelProto:
        return quantizer.quantize(replace(base, fallback=frozenset(base.fallback | set(fallback))))

    reference = model_outputs(fp32_model, samples, settings) if fp32_outputs is None else fp32_outputs
    all_int8 = quantizer.quantize(base)
    base_error = output_error(reference, model_outputs(all_int8, samples, settings))
    profiling = time.perf_counter()
    layers = initializers_of(fp32_model, sorted(set(quantizable_nodes(fp32_model)) | every))
    fp32_ms, fp32_rest = profile_layers(fp32_model, timed, layers, settings, profile_runs)
    int8_ms, int8_rest = profile_layers(all_int8, timed, layers, settings, profile_runs)
    profiled = time.perf_counter()
    timing = None if revert_timing is None else replace(revert_timing, threads=settings.threads)
    fp32_timed = int8_timed = None
    if timing is not None:
        fp32_timed, int8_timed = _session(fp32_model, timing), _session(all_int8, timing)
    timed_seconds = 0.0

    def speedup_over(first: ort.InferenceSession | None, model: onnx.ModelProto) -> float | None:
        """``t_first / t_model``, timed in pairs; ``None`` without ``revert_timing``."""
        nonlocal timed_seconds
        if first is None or timing is None:
            return None
        begin = time.perf_counter()
        ratio = measure_latency(first, _session(model, timing), timed, timing).lat_diff
        timed_seconds += time.perf_counter() - begin
        return ratio

    sens: dict[str, LayerSensitivity] = {}
    # One layer's two models at a time, dropped once measured: holding all 2 n of them raised a
    # PP-OCRv4 study's peak (51 layers) to 2.3 GB, against 0.95 GB like this.
    for unit, members in units.items():
        only, reverted = with_fallback(every - set(members)), with_fallback(members)
        # The all-int8 model in measure_latency's "fp32" slot: t_all / t_reverted.
        kept = speedup_over(int8_timed, reverted)
        sens[unit] = LayerSensitivity(
            error_alone=output_error(reference, model_outputs(only, samples, settings)),
            error_recovered=base_error - output_error(reference, model_outputs(reverted, samples, settings)),
            fp32_ms=sum(fp32_ms[n] for n in members),
            int8_ms=sum(int8_ms[n] for n in members),
            revert_cost=None if kept is None else 1.0 - kept,
            alone_speedup=speedup_over(fp32_timed, only),
        )
    total = time.perf_counter() - start
    _logger.info(
        "Measured the sensitivity of %d layers in %.1f s (output errors %.1f s, profiles %.1f s, timings "
        "of each revert and each layer alone %.1f s): all-int8 error %.3g; layer node time fp32 %.3f ms, "
        "int8 %.3f ms; unattributed %.3f ms and %.3f ms",
        len(units),
        total,
        total - (profiled - profiling) - timed_seconds,
        profiled - profiling,
        timed_seconds,
        base_error,
        sum(fp32_ms[n] for n in every),
        sum(int8_ms[n] for n in every),
        fp32_rest,
        int8_rest,
    )
    return sens


def measure_scope_errors(
    fp32_model: onnx.ModelProto,
    quantizer: Quantizer,
    feeds: Sequence[Feed],
    combinations: Sequence[Mapping[str, Any]],
    to_config: Callable[[Mapping[str, Any]], QuantConfig],
    *,
    one_at_a_time: Mapping[str, Sequence[Any]] | None = None,
    n_samples: int = 32,
    settings: BenchmarkSettings | None = None,
    fp32_outputs: Sequence[Sequence[np.ndarray]] | None = None,
) -> list[ScopeError]:
    """The all-int8 output error (:func:`output_error`) of each combination of the other parameters.

    No timing (:func:`measure_kernel_speed` adds it): one quantized model and ``n_samples`` runs
    per distinct configuration (calibration is ``quantizer``'s, once per range estimator). A
    combination that fails to build or run is recorded as failed, with its reason, and the others
    are measured: a failing choice is what the study learns (:mod:`optuna_quant.trial.failures`),
    not the end of the measurement.

    Args:
        fp32_model: The fp32 model that ``quantizer`` quantizes.
        quantizer: Builds the int8 models.
        feeds: Input dicts; the first ``n_samples`` count.
        combinations: The combinations (:func:`scope_combinations`), the reference's first.
        to_config: The all-int8 configuration of a combination.
        one_at_a_time: Choices of parameters that every combination holds at one choice, each
            measured after them at the lowest-error combination, one parameter changed at a
            time: one model per choice instead of a multiple of the combinations.
        n_samples: Feeds on which the output error is measured.
        settings: Threads for every session (default :class:`BenchmarkSettings`).
        fp32_outputs: The fp32 model's outputs on the first ``n_samples`` feeds
            (:func:`model_outputs`), when measured already.

    Returns:
        A :data:`ScopeError` per combination, in their order, then one per choice of
        ``one_at_a_time`` that the lowest-error combination does not hold.

    Raises:
        ValueError: If ``combinations`` is empty or ``n_samples`` is not positive.
    """
    if not combinations:
        raise ValueError("combinations must hold at least the reference's.")
    _check_positive(n_samples=n_samples)
    settings = settings or BenchmarkSettings()
    samples = list(feeds[:n_samples])
    start = time.perf_counter()
    reference = model_outputs(fp32_model, samples, settings) if fp32_outputs is None else fp32_outputs
    # Combinations that build the same model (the range estimators under dynamic) are measured once.
    by_config: dict[QuantConfig, dict[str, Any]] = {}

    def error(config: QuantConfig) -> dict[str, Any]:
        try:
            return {"error": output_error(reference, model_outputs(quantizer.quantize(config), samples, settings))}
        except Exception as err:  # noqa: BLE001 - recorded: which choice fails is a finding
            return {"error": None, "failure": failure_reason(err)}

    def measured(params: Mapping[str, Any]) -> dict[str, Any]:
        try:
            config = to_config(params)
        except ValueError as err:  # a combination that describes no configuration fails to build
            return {"error": None, "failure": failure_reason(err)}
        if config not in by_config:
            by_config[config] = error(config)
        return by_config[config]

    errors: list[ScopeError] = [{"params": dict(params), **measured(params)} for params in combinations]
    at = lowest_error(errors)["params"]
    changed = [{**at, name: choice} for name, choices in (one_at_a_time or {}).items() for choice in choices if choice != at[name]]
    errors += [{"params": params, **measured(params)} for params in changed]
    best = lowest_error(errors)
    failed = sum(entry["error"] is None for entry in errors)
    _logger.info(
        "Measured the all-int8 output error of %d combinations in %.1f s: reference %s, lowest %.3g at %s%s",
        len(errors),
        time.perf_counter() - start,
        "failed" if errors[0]["error"] is None else f"{errors[0]['error']:.3g}",
        best["error"],
        best["params"],
        f"; {failed} failed to build or run" if failed else "",
    )
    return errors


def measure_kernel_speed(
    fp32_model: onnx.ModelProto,
    quantizer: Quantizer,
    scope_errors: Sequence[ScopeError],
    to_config: Callable[[Mapping[str, Any]], QuantConfig],
    timing: BenchmarkSettings,
    timing_feed: Feed,
    *,
    rounds: int = KERNEL_TIMING_ROUNDS,
) -> list[ScopeError]:
    """``scope_errors`` with the all-int8 speed-up over fp32 of each set of kernels as ``lat_diff``.

    The range estimator changes only the scales: the combinations that differ in it alone share
    one set of kernels and one ``lat_diff``. Each set is timed in ``rounds`` rounds, every set once
    a round, on ``timing`` split over them (a trial's worth of runs in all), and its ``lat_diff``
    is the median: on a shared machine one short timing of a sub-millisecond model moves by 5 %
    from one call to the next (docs/benchmarks.md, mtcnn_rnet). A set is built as its
    lowest-error combination was. Sets whose lowest error is over :data:`KERNEL_ERROR_SPAN` times
    the lowest of all, and failed combinations, are not timed.

    Args:
        fp32_model: The fp32 model that ``quantizer`` quantizes.
        quantizer: Builds the int8 models.
        scope_errors: :func:`measure_scope_errors`' result.
        to_config: The all-int8 configuration of a combination, as given to it.
        timing: How one trial is timed (its threads included).
        timing_feed: The input that is timed.
        rounds: Rounds of timing.

    Returns:
        A copy of ``scope_errors``, ``lat_diff`` added where timed.
    """
    _check_positive(rounds=rounds)
    start = time.perf_counter()
    lowest = lowest_error(scope_errors)["error"]
    kernels_of: dict[int, QuantConfig] = {}
    best: dict[QuantConfig, tuple[float, QuantConfig]] = {}
    for index, entry in enumerate(scope_errors):
        if entry["error"] is not None:
            config = to_config(entry["params"])
            kernels = replace(config, range_estimator=RANGE_ESTIMATORS[0])
            kernels_of[index] = kernels
            if kernels not in best or entry["error"] < best[kernels][0]:
                best[kernels] = (entry["error"], config)
    timed = [kernels for kernels, (error, _) in best.items() if error <= KERNEL_ERROR_SPAN * lowest]
    # Serialized once and sessions made per round: a set's model is built once, and a session
    # holds its weights only while it is timed.
    models = {kernels: quantizer.quantize(best[kernels][1]).SerializeToString() for kernels in timed}
    per_round = replace(timing, min_seconds=timing.min_seconds / rounds)
    fp32_session = _session(fp32_model, per_round)
    readings: dict[QuantConfig, list[float]] = {kernels: [] for kernels in timed}
    for _ in range(rounds):
        for kernels in timed:
            session = _session(models[kernels], per_round)
            readings[kernels].append(measure_latency(fp32_session, session, timing_feed, per_round).lat_diff)
    speed = {kernels: float(np.median(values)) for kernels, values in readings.items()}
    _logger.info(
        "Timed %d of %d sets of kernels all-int8 in %.1f s (%d rounds): speed-up %s",
        len(timed),
        len(best),
        time.perf_counter() - start,
        rounds,
        "none" if not speed else f"{min(speed.values()):.3g} to {max(speed.values()):.3g}",
    )
    with_speed = [dict(entry) for entry in scope_errors]
    for index, kernels in kernels_of.items():
        if kernels in speed:
            with_speed[index]["lat_diff"] = speed[kernels]
    return with_speed


def lowest_error(scope_errors: Sequence[ScopeError]) -> ScopeError:
    """The measured combination with the lowest all-int8 output error: where to measure the layers.

    Raises:
        ValueError: If every combination failed.
    """
    measured = [entry for entry in scope_errors if entry["error"] is not None]
    if not measured:
        raise ValueError(f"Every one of the {len(scope_errors)} combinations failed, e.g. {scope_errors[0]['failure']}")
    return min(measured, key=lambda entry: entry["error"])
