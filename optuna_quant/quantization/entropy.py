"""Entropy calibration's threshold search, onnxruntime's own without its Python loops over bins.

onnxruntime's ``HistogramCollector.get_entropy_threshold`` tries every symmetric window of the
histogram around zero, and for each merges the window into ``num_quantized_bins`` bins and
expands them back with two Python loops and Python's ``sum`` over NumPy slices, most of an
Entropy calibration's time. :func:`entropy_threshold` builds the same reference and candidate
distributions for the same windows with NumPy's reductions and a cumulative sum, and scores them
with onnxruntime's own ``smooth_distribution`` and ``entropy``: the same thresholds, bit for bit
(how much sooner: docs/benchmarks.md, "Seconds a study spends besides its trials").
:class:`FastEntropyCollector` is onnxruntime's collector with it.

Example:
    >>> hist, edges = np.histogram(np.linspace(-1, 1, 4001, dtype=np.float32), 2048, range=(-1, 1))
    >>> low, high = entropy_threshold((hist, edges, np.float32(-1), np.float32(1)), 128)
    >>> bool(-1 <= low < 0 < high <= 1)
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnxruntime.quantization import calibrate
from onnxruntime.quantization.quant_utils import smooth_distribution


def entropy_threshold(histogram: tuple[Any, ...], num_quantized_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """The (low, high) range whose quantized distribution is closest in KL divergence to the data's.

    Args:
        histogram: onnxruntime's histogram entry: integer counts, their edges, the data's minimum
            and maximum (a threshold may follow, unused).
        num_quantized_bins: The bins of the quantized distribution (128 for 8 bits).

    Returns:
        The window's edges, clipped to the data's minimum and maximum, as
        ``HistogramCollector.get_entropy_threshold`` returns them.

    Raises:
        TypeError: If the counts are not integers: the windows' sums would then depend on the
            order of summation, and the thresholds could differ from onnxruntime's.
    """
    hist, edges = np.asarray(histogram[0]), histogram[1]
    if not np.issubdtype(hist.dtype, np.integer):
        raise TypeError(f"entropy_threshold needs integer counts, got {hist.dtype}.")
    num_bins = hist.size
    zero_bin = num_bins // 2
    half = num_quantized_bins // 2
    outside_before = np.concatenate([np.zeros(1, hist.dtype), np.cumsum(hist)])  # sum(hist[:k])
    divergence = np.zeros(zero_bin - half + 1)
    for k, width in enumerate(range(half, zero_bin + 1)):
        start, end = _window(zero_bin, width, num_bins)
        window = hist[start:end]
        reference = window.copy()  # p: the window, the outliers folded into its ends
        reference[0] += outside_before[start]
        reference[-1] += outside_before[-1] - outside_before[end]
        merged = window.size // num_quantized_bins
        body = num_quantized_bins * merged
        quantized = window[:body].reshape(num_quantized_bins, merged).sum(axis=1)
        quantized[-1] += window[body:].sum()
        nonzero = (reference[:body] != 0).reshape(num_quantized_bins, merged).sum(axis=1)
        candidate = np.zeros(window.size, dtype=np.int64)  # q: each merged bin spread over its nonzero bins
        # Assigning the quotient to int64 truncates it, as onnxruntime's loop does.
        candidate[:body] = np.repeat(np.where(nonzero != 0, quantized / np.maximum(nonzero, 1), 0), merged)
        p, q = smooth_distribution(reference), smooth_distribution(candidate)
        divergence[k] = np.inf if p is None or q is None else np.array(calibrate.entropy(p, q), dtype=edges.dtype)
    start, end = _window(zero_bin, half + int(np.argmin(divergence)), num_bins)
    return max(edges[start], histogram[2]), min(edges[end], histogram[3])


def _window(zero_bin: int, width: int, num_bins: int) -> tuple[int, int]:
    return zero_bin - width, min(zero_bin + width + 1, num_bins)


class FastEntropyCollector(calibrate.HistogramCollector):
    """onnxruntime's histogram collector, its Entropy thresholds found by :func:`entropy_threshold`
    (onnxruntime's own search for counts that are not integers)."""

    def get_entropy_threshold(self, histogram: tuple[Any, ...], num_quantized_bins: int) -> tuple[Any, Any]:
        if not np.issubdtype(np.asarray(histogram[0]).dtype, np.integer):
            return super().get_entropy_threshold(histogram, num_quantized_bins)
        return entropy_threshold(histogram, num_quantized_bins)
