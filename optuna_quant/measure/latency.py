"""Paired fp32/int8 latency: both sessions timed in interleaved blocks in one run.

A shared, noisy machine makes absolute times drift by tens of percent between runs, but the drift
hits both models alike when they are timed side by side. So ``lat_diff`` is the median over blocks
of the per-block ratio ``fp32 / int8``, each block timing both models back to back in alternating
order, and its spread is the interquartile range of those ratios relative to their median.

Another job on the same cores (a second worker evaluating a batch, say) does not hit both models
alike: it preempts runs and evicts caches for a while, and whichever model runs then looks slower.
Such noise only ever adds time, so each block is summarised by its fastest run of each model (the
``"min"`` statistic), and a block whose median run is more than ``contention`` slower than its
10th-percentile run is counted as contended and timed again, up to ``retimes`` times in a
measurement.
:class:`LatencyResult` says how many blocks were timed again and whether any stayed contended.

A caller may watch the blocks as they come (``on_block``) and stop the timing once it has seen
enough, as a pruner does with a model that cannot beat the best one: the result then holds the
blocks timed so far (``stopped``).

Example:
    >>> settings = BenchmarkSettings(threads=1, blocks=8, min_seconds=0.5)
    >>> result = measure_latency(fp32_session, int8_session, feed, settings)  # doctest: +SKIP
    >>> result.lat_diff, result.retimed, result.contended                     # doctest: +SKIP
    (2.16, 1, False)
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
import logging
import math
import time
from typing import Any

import numpy as np
import onnxruntime as ort


_logger = logging.getLogger("optuna_quant")

STATISTICS: tuple[str, ...] = ("min", "median")
"""How a block's runs of one model are summarised: the fastest run, or the median run."""
NOISY_SPREAD = 0.05
"""A measurement whose ``lat_diff`` spread (interquartile range over median) is above this, or
that stayed contended, is noisy (:func:`steady_latency`)."""
RETIMES = 2
"""How many times :func:`steady_latency` measures a noisy pair again at most."""
FAST_PERCENTILE = 10.0
"""A block's contention is its median run against this percentile of its runs, not against its
fastest run: the fastest of hundreds of sub-millisecond runs is an outlier, and every block of
such a model would read as contended on a quiet machine. Below 10 runs it is near the fastest."""

BlockWatch = Callable[[float], bool]
"""Called with each block's ``fp32 / int8`` ratio as it is timed; ``True`` stops the timing."""


@dataclass(frozen=True)
class BenchmarkSettings:
    """How latency is measured (the ``benchmark`` section of a config file).

    Attributes:
        threads: onnxruntime intra-op threads for both sessions (inter-op is 1).
        warmup: Untimed runs of each session before timing.
        blocks: Interleaved blocks; each gives one fp32/int8 ratio.
        min_seconds: Total time to spend timing; sets the runs per block.
        batch_size: Samples per timed run, taken from the calibration data, when no
            ``latency_data`` gives the input to time on.
        statistic: How a block's runs of one model are summarised, one of :data:`STATISTICS`:
            ``"min"`` (the fastest run: contention only adds time) or ``"median"``.
        contention: A block whose median run of either model is more than this fraction slower
            than its :data:`FAST_PERCENTILE` run is contended (0.05: 5 % slower).
        retimes: Contended blocks timed again, at most, in one measurement (0: none).
    """

    threads: int = 1
    warmup: int = 10
    blocks: int = 10
    min_seconds: float = 1.0
    batch_size: int = 1
    statistic: str = "min"
    contention: float = 0.05
    retimes: int = 5

    def __post_init__(self) -> None:
        for name in ("threads", "warmup", "blocks", "batch_size", "retimes"):
            value = getattr(self, name)
            least = 0 if name in ("warmup", "retimes") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                kind = "a non-negative" if least == 0 else "a positive"
                raise ValueError(f"benchmark.{name} must be {kind} integer, got {value!r}.")
        if not isinstance(self.min_seconds, (int, float)) or not 0 < self.min_seconds <= 3600:
            raise ValueError(f"benchmark.min_seconds must lie in (0, 3600], got {self.min_seconds!r}.")
        if self.statistic not in STATISTICS:
            raise ValueError(f"benchmark.statistic must be one of {STATISTICS}, got {self.statistic!r}.")
        contention = self.contention
        if isinstance(contention, bool) or not isinstance(contention, (int, float)) or not contention > 0:
            raise ValueError(f"benchmark.contention must be a positive fraction, got {self.contention!r}.")

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
        fp32_ms: Median over blocks of the fp32 block statistic, in milliseconds.
        int8_ms: Median over blocks of the int8 block statistic, in milliseconds.
        lat_diff: Median over blocks of ``fp32 / int8``.
        spread: Interquartile range of the block ratios over their median.
        retimed: Blocks timed again because they were contended.
        contended: Whether some block kept was still contended when the re-times ran out.
        feed: The shape of each input timed (:func:`feed_shapes`).
        blocks: The blocks timed.
        stopped: Whether the watcher stopped the timing before all blocks ran.
    """

    fp32_ms: float
    int8_ms: float
    lat_diff: float
    spread: float
    retimed: int = 0
    contended: bool = False
    feed: str = ""
    blocks: int = 0
    stopped: bool = False


@dataclass(frozen=True)
class _Block:
    fp32: np.ndarray
    int8: np.ndarray

    def inflation(self) -> float:
        """How much slower the median run is than the :data:`FAST_PERCENTILE` run, the worse of
        both models."""
        return max(float(np.median(t) / np.percentile(t, FAST_PERCENTILE)) for t in (self.fp32, self.int8)) - 1.0


def feed_shapes(feed: Mapping[str, np.ndarray]) -> str:
    """The shape of each input of ``feed``, as a person reads it.

    Example:
        >>> feed_shapes({"input_ids": np.zeros((8, 128), np.int64), "x": np.zeros(3)})
        'input_ids 8x128, x 3'
    """
    return ", ".join(f"{name} {'x'.join(map(str, np.shape(array)))}" for name, array in feed.items())


def _run_times(session: ort.InferenceSession, feed: Mapping[str, np.ndarray], runs: int) -> np.ndarray:
    times = np.empty(runs)
    for i in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times[i] = time.perf_counter() - start
    return times


def _time_block(
    fp32: ort.InferenceSession, int8: ort.InferenceSession, feed: Mapping[str, np.ndarray], runs: int, fp32_first: bool
) -> _Block:
    # Alternate which model goes first, so neither always inherits the other's cache state.
    if fp32_first:
        t_fp32 = _run_times(fp32, feed, runs)
        return _Block(t_fp32, _run_times(int8, feed, runs))
    t_int8 = _run_times(int8, feed, runs)
    return _Block(_run_times(fp32, feed, runs), t_int8)


def measure_latency(
    fp32: ort.InferenceSession,
    int8: ort.InferenceSession,
    feed: Mapping[str, np.ndarray],
    settings: BenchmarkSettings,
    on_block: BlockWatch | None = None,
) -> LatencyResult:
    """Time ``fp32`` and ``int8`` on ``feed`` in interleaved blocks and compare them.

    Contended blocks (see :class:`BenchmarkSettings`) are timed again while ``settings.retimes``
    lasts; of the attempts at one block the least contended is kept. ``on_block`` sees each kept
    block's ratio and may stop the timing there.
    """
    warm_fp32 = _run_times(fp32, feed, max(settings.warmup, 1))
    warm_int8 = _run_times(int8, feed, max(settings.warmup, 1))
    pair_seconds = float(np.median(warm_fp32) + np.median(warm_int8))
    runs = max(3, math.ceil(settings.min_seconds / settings.blocks / max(pair_seconds, 1e-6)))
    statistic = np.min if settings.statistic == "min" else np.median
    blocks: list[_Block] = []
    ratios: list[float] = []
    retimed = 0
    stopped = False
    for index in range(settings.blocks):
        block = _time_block(fp32, int8, feed, runs, index % 2 == 0)
        while block.inflation() > settings.contention and retimed < settings.retimes:
            retimed += 1
            again = _time_block(fp32, int8, feed, runs, index % 2 == 0)
            block = min(block, again, key=_Block.inflation)
        blocks.append(block)
        ratios.append(float(statistic(block.fp32) / statistic(block.int8)))
        if on_block is not None and on_block(ratios[-1]) and index + 1 < settings.blocks:
            stopped = True
            break
    median_ratio = float(np.median(ratios))
    q25, q75 = np.percentile(ratios, [25, 75])
    return LatencyResult(
        fp32_ms=float(np.median([statistic(b.fp32) for b in blocks]) * 1000),
        int8_ms=float(np.median([statistic(b.int8) for b in blocks]) * 1000),
        lat_diff=median_ratio,
        spread=float((q75 - q25) / median_ratio),
        retimed=retimed,
        contended=any(b.inflation() > settings.contention for b in blocks),
        feed=feed_shapes(feed),
        blocks=len(blocks),
        stopped=stopped,
    )


def steady_latency(
    fp32: ort.InferenceSession,
    int8: ort.InferenceSession,
    feed: Mapping[str, np.ndarray],
    settings: BenchmarkSettings,
    on_block: BlockWatch | None = None,
) -> LatencyResult:
    """:func:`measure_latency`, measured again while noisy (at most :data:`RETIMES` times); the
    least noisy measurement is kept. ``on_block`` watches the first measurement's blocks and may
    stop it there; a noisy measurement, timed again, is timed in full: its blocks are the least
    trustworthy to stop on.

    Contended blocks are timed again inside one measurement; this rule is for a whole
    measurement that stayed noisy, as on a machine oversubscribed for longer than a block: there
    a phantom speed-up would become a study's best (docs/benchmarks.md).
    """
    latency = measure_latency(fp32, int8, feed, settings, on_block)
    for attempt in range(1, RETIMES + 1):
        if latency.stopped or not (latency.contended or latency.spread > NOISY_SPREAD):
            break
        _logger.info(
            "Timing noisy (lat_diff %.4f, spread %.3f%s): timing again (%d / %d).",
            latency.lat_diff,
            latency.spread,
            ", contended" if latency.contended else "",
            attempt,
            RETIMES,
        )
        again = measure_latency(fp32, int8, feed, settings)
        if again.spread < latency.spread:
            latency = again
    return latency
