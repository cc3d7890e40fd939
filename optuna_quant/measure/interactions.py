"""Pairs of adjacent layers whose joint revert recovers what neither revert recovers alone.

The tensor between two quantized layers is quantized twice over: by the first layer's int8
output and by the second's int8 input. Keeping either layer alone in fp32 leaves it quantized by
the other, so neither single revert recovers the error it causes, and a prior built one layer at
a time scores both layers int8. After the one-layer-at-a-time pass
(:func:`~optuna_quant.measure.sensitivity.measure_sensitivity`), the few adjacent pairs that it
leaves ambiguous are reverted together, once each (:func:`measure_pairs`).

Example:
    >>> pairs = measure_pairs(model, quantizer, feeds, units, sens, base_config=base)  # doctest: +SKIP
    >>> pairs[0].layers, pairs[0].error_recovered                                     # doctest: +SKIP
    (('conv2', 'conv3'), 0.113)
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
import logging
from typing import Any

import numpy as np
import onnx

from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.sensitivity import LayerSensitivity
from optuna_quant.measure.sensitivity import model_outputs
from optuna_quant.measure.sensitivity import output_error
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.model_io import Feed
from optuna_quant.quantization.quantize import Quantizer


_logger = logging.getLogger(__name__)

MAX_PAIRS = 4
"""Pairs measured at most: each costs one quantized model's output error, no timing."""
AMBIGUOUS_SHARE = 0.5
"""A layer is ambiguous when its revert recovers less than this share of the error its int8
causes alone: the error is there, and its own revert does not remove it."""


@dataclass(frozen=True)
class PairRecovery:
    """What reverting two adjacent layers together recovers.

    Attributes:
        layers: The two layers (or groups), the producer first.
        error_recovered: Output noise-to-signal ratio that keeping both in fp32 removes from the
            all-int8 model, as :attr:`~LayerSensitivity.error_recovered` for one layer.
    """

    layers: tuple[str, str]
    error_recovered: float

    def to_dict(self) -> dict[str, Any]:
        """The measurement as a JSON-serialisable dict."""
        return {"layers": list(self.layers), "error_recovered": self.error_recovered}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairRecovery:
        """The measurement stored by :meth:`to_dict`.

        Example:
            >>> PairRecovery.from_dict({"layers": ["a", "b"], "error_recovered": 0.1})
            PairRecovery(layers=('a', 'b'), error_recovered=0.1)
        """
        first, second = data["layers"]
        return cls((str(first), str(second)), float(data["error_recovered"]))

    def interaction(self, sens: Mapping[str, LayerSensitivity]) -> float:
        """What the joint revert recovers beyond the two single reverts (their gains, not losses)."""
        return self.error_recovered - sum(max(sens[layer].error_recovered, 0.0) for layer in self.layers)


def adjacent_pairs(model: onnx.ModelProto, units: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """Pairs ``(a, b)`` of units where a node of ``b`` reads, through nodes of no unit (ReLU,
    pooling, reshapes), a tensor that a node of ``a`` writes; in graph order.

    Only a node's first input is followed: the data input of Conv, Gemm and MatMul (their
    weights are initializers).
    """
    producer = {output: node for node in model.graph.node for output in node.output}
    unit_of = {node: unit for unit, members in units.items() for node in members}
    pairs: list[tuple[str, str]] = []
    for node in model.graph.node:
        second = unit_of.get(node.name)
        if second is None or not node.input:
            continue
        upstream = producer.get(node.input[0])
        while upstream is not None and upstream.name not in unit_of:
            upstream = producer.get(upstream.input[0]) if upstream.input else None
        if upstream is not None and unit_of[upstream.name] != second:
            pair = (unit_of[upstream.name], second)
            if pair not in pairs:
                pairs.append(pair)
    return pairs


def ambiguous_pairs(
    sens: Mapping[str, LayerSensitivity], pairs: Sequence[tuple[str, str]], limit: int = MAX_PAIRS
) -> list[tuple[str, str]]:
    """The ``pairs`` whose two layers are both ambiguous (:data:`AMBIGUOUS_SHARE`), the most
    costly alone in int8 first, at most ``limit``.

    Example:
        >>> sens = {"a": LayerSensitivity(0.01, -0.005, 1, 1), "b": LayerSensitivity(0.1, 0.01, 1, 1),
        ...         "c": LayerSensitivity(0.001, 0.002, 1, 1)}
        >>> ambiguous_pairs(sens, [("a", "b"), ("b", "c")])
        [('a', 'b')]
    """

    def ambiguous(layer: str) -> bool:
        s = sens[layer]
        return s.error_alone > 0 and s.error_recovered < AMBIGUOUS_SHARE * s.error_alone

    candidates = [pair for pair in pairs if all(ambiguous(layer) for layer in pair)]
    return sorted(candidates, key=lambda pair: -sum(sens[layer].error_alone for layer in pair))[:limit]


def measure_pairs(
    fp32_model: onnx.ModelProto,
    quantizer: Quantizer,
    feeds: Sequence[Feed],
    units: Mapping[str, Sequence[str]],
    sens: Mapping[str, LayerSensitivity],
    *,
    base_config: QuantConfig,
    n_samples: int = 32,
    settings: BenchmarkSettings | None = None,
    limit: int = MAX_PAIRS,
    fp32_outputs: Sequence[Sequence[np.ndarray]] | None = None,
    base_error: float | None = None,
) -> list[PairRecovery]:
    """Revert together each adjacent pair that ``sens`` leaves ambiguous (:func:`ambiguous_pairs`).

    Costs one quantized model's outputs per pair on ``n_samples`` feeds, and the fp32 and the
    all-int8 outputs unless given; nothing when no pair is ambiguous.

    Args:
        fp32_model: The fp32 model that ``quantizer`` quantizes.
        quantizer: Builds the int8 models.
        feeds: Input dicts; the first ``n_samples`` measure the output error.
        units: The searchable layers' nodes, by layer (or group) name, as measured in ``sens``.
        sens: The one-layer-at-a-time measurement at ``base_config``.
        base_config: The all-int8 configuration ``sens`` was measured at.
        n_samples: Feeds on which the output error is measured.
        settings: Threads for every session (default :class:`BenchmarkSettings`).
        limit: Pairs measured at most.
        fp32_outputs: The fp32 model's outputs on the first ``n_samples`` feeds
            (:func:`~optuna_quant.measure.sensitivity.model_outputs`), when measured already.
        base_error: The output error of ``base_config``, when measured already (by
            :func:`~optuna_quant.measure.sensitivity.measure_scope_errors`).

    Returns:
        What each measured pair's joint revert recovers.
    """
    pairs = ambiguous_pairs(sens, adjacent_pairs(fp32_model, units), limit)
    if not pairs:
        return []
    settings = settings or BenchmarkSettings()
    samples = list(feeds[:n_samples])
    reference = model_outputs(fp32_model, samples, settings) if fp32_outputs is None else fp32_outputs
    if base_error is None:
        base_error = output_error(reference, model_outputs(quantizer.quantize(base_config), samples, settings))
    measured = []
    for pair in pairs:
        fallback = base_config.fallback | {node for layer in pair for node in units[layer]}
        reverted = quantizer.quantize(replace(base_config, fallback=frozenset(fallback)))
        recovered = base_error - output_error(reference, model_outputs(reverted, samples, settings))
        measured.append(PairRecovery(pair, recovered))
    _logger.info(
        "Reverted %d ambiguous pairs of adjacent layers together: %s",
        len(measured),
        ", ".join(f"{a} + {b} recovers {p.error_recovered:.3g}" for p in measured for a, b in [p.layers]),
    )
    return measured
