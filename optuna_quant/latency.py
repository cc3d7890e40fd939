"""Paired fp32/int8 latency: both sessions timed in interleaved blocks in one run.

A shared, noisy machine makes absolute times drift by tens of percent between runs, but the drift
hits both models alike when they are timed side by side. So ``lat_diff`` is the median over blocks
of the per-block ratio ``fp32 / int8``, each block timing both models back to back in alternating
order, and its spread is the interquartile range of those ratios relative to their median.

Example:
    >>> settings = BenchmarkSettings(threads=1, blocks=8, min_seconds=0.5)
    >>> result = measure_latency(fp32_session, int8_session, feed, settings)  # doctest: +SKIP
    >>> result.lat_diff                                                        # doctest: +SKIP
    2.41
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
import math
import time
from typing import Any

import numpy as np
import onnxruntime as ort


@dataclass(frozen=True)
class BenchmarkSettings:
    """How latency is measured (the ``benchmark`` section of a config file).

    Attributes:
        threads: onnxruntime intra-op threads for both sessions (inter-op is 1).
        warmup: Untimed runs of each session before timing.
        blocks: Interleaved blocks; each gives one fp32/int8 ratio.
        min_seconds: Total time to spend timing; sets the runs per block.
        batch_size: Samples per timed run, taken from the calibration data.
    """

    threads: int = 1
    warmup: int = 10
    blocks: int = 10
    min_seconds: float = 1.0
    batch_size: int = 1

    def __post_init__(self) -> None:
        for name in ("threads", "warmup", "blocks", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "warmup" else 1):
                raise ValueError(f"benchmark.{name} must be a positive integer, got {value!r}.")
        if not isinstance(self.min_seconds, (int, float)) or not 0 < self.min_seconds <= 3600:
            raise ValueError(f"benchmark.min_seconds must lie in (0, 3600], got {self.min_seconds!r}.")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchmarkSettings:
        """Settings from a config mapping; an unknown key is an error that names it."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"Unknown benchmark key(s) {sorted(unknown)}; known keys are "
                f"{sorted(cls.__dataclass_fields__)}."
            )
        return cls(**data)

    def session_options(self) -> ort.SessionOptions:
        """Session options with the threads pinned, so that both models run alike."""
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        return options


@dataclass(frozen=True)
class LatencyResult:
    """A paired latency measurement.

    Attributes:
        fp32_ms: Median fp32 time per run, in milliseconds.
        int8_ms: Median int8 time per run, in milliseconds.
        lat_diff: Median over blocks of ``fp32 / int8``.
        spread: Interquartile range of the block ratios over their median.
    """

    fp32_ms: float
    int8_ms: float
    lat_diff: float
    spread: float


def _run_times(session: ort.InferenceSession, feed: Mapping[str, np.ndarray], runs: int) -> np.ndarray:
    times = np.empty(runs)
    for i in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times[i] = time.perf_counter() - start
    return times


def measure_latency(
    fp32: ort.InferenceSession,
    int8: ort.InferenceSession,
    feed: Mapping[str, np.ndarray],
    settings: BenchmarkSettings,
) -> LatencyResult:
    """Time ``fp32`` and ``int8`` on ``feed`` in interleaved blocks and compare them."""
    warm_fp32 = _run_times(fp32, feed, max(settings.warmup, 1))
    warm_int8 = _run_times(int8, feed, max(settings.warmup, 1))
    pair_seconds = float(np.median(warm_fp32) + np.median(warm_int8))
    runs = max(3, math.ceil(settings.min_seconds / settings.blocks / max(pair_seconds, 1e-6)))
    ratios, fp32_times, int8_times = [], [], []
    for block in range(settings.blocks):
        # Alternate which model goes first, so neither always inherits the other's cache state.
        if block % 2 == 0:
            t_fp32, t_int8 = _run_times(fp32, feed, runs), _run_times(int8, feed, runs)
        else:
            t_int8, t_fp32 = _run_times(int8, feed, runs), _run_times(fp32, feed, runs)
        # Medians within a block shrug off the odd run that another process interrupted.
        ratios.append(np.median(t_fp32) / np.median(t_int8))
        fp32_times.append(t_fp32)
        int8_times.append(t_int8)
    ratios_arr = np.array(ratios)
    median_ratio = float(np.median(ratios_arr))
    q25, q75 = np.percentile(ratios_arr, [25, 75])
    return LatencyResult(
        fp32_ms=float(np.median(np.concatenate(fp32_times)) * 1000),
        int8_ms=float(np.median(np.concatenate(int8_times)) * 1000),
        lat_diff=median_ratio,
        spread=float((q75 - q25) / median_ratio),
    )
