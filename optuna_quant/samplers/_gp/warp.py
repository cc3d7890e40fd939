"""A monotone warping of heavy-tailed targets and constraints before a GP models them."""

from __future__ import annotations

import numpy as np


def finite(values: np.ndarray) -> np.ndarray:
    """``values`` with infinities replaced by the finite extremes (or +-1 when there are none)."""
    finite = values[np.isfinite(values)]
    high = float(np.max(finite)) if len(finite) else 1.0
    low = float(np.min(finite)) if len(finite) else -1.0
    return np.nan_to_num(values, nan=high, posinf=max(high, 0.0) + 1.0, neginf=min(low, 0.0) - 1.0)


def warp(values: np.ndarray, centre: float) -> np.ndarray:
    """A monotone map that keeps ``centre`` in place and compresses heavy tails.

    Quantization results are heavy-tailed (one fp32 fallback too few can cost tens of percent of
    accuracy); a GP on the raw values spends its variance on those outliers. The signed
    logarithm ``sign(u) * log1p(|u|)`` of the values scaled by their median distance to
    ``centre`` keeps the order and the sign relative to ``centre``, which is all that expected
    improvement and the probability of feasibility (``centre = 0``) look at.
    """
    values = finite(np.asarray(values, dtype=float))
    scale = float(np.median(np.abs(values - centre)))
    u = (values - centre) / (scale if scale > 1e-12 else 1.0)
    return np.sign(u) * np.log1p(np.abs(u))

