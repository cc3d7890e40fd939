"""Accuracy recovery: transforms of the fp32 graph that make its int8 model more accurate.

Each transform is a scope of the search with its own parameter, ``"off"`` first
(:data:`RECOVERY_CHOICES`), so that the reference is the model without it. A transform changes
the weights, never what the fp32 model computes: the quantizer checks each transformed model's
outputs against the user's model before it quantizes it
(:class:`~optuna_quant.quantization.quantize.Quantizer`), and builds it once per study.

A transform is anything with the :class:`Transform` protocol, registered in :data:`TRANSFORMS`
under the name that is its scope and its parameter; they apply in the registry's order.

Example:
    >>> sorted(TRANSFORMS)
    ['equalization']
    >>> applicable_transforms(model)                                    # doctest: +SKIP
    ('equalization',)
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import onnx

from optuna_quant.quantization.equalization import equalizable_pairs
from optuna_quant.quantization.equalization import equalize


RECOVERY_CHOICES: tuple[str, ...] = ("off", "on")
"""Each transform's choices, the reference first."""


class Transform(Protocol):
    """A change of an fp32 graph's weights that leaves its outputs unchanged."""

    def sites(self, model: onnx.ModelProto) -> tuple[str, ...]:
        """The names of the nodes of ``model`` that the transform changes; none: it does not apply."""

    def apply(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A transformed copy of ``model``; ``model`` is not changed."""


class CrossLayerEqualization:
    """:mod:`optuna_quant.quantization.equalization` as a :class:`Transform`."""

    def sites(self, model: onnx.ModelProto) -> tuple[str, ...]:
        return tuple(name for pair in equalizable_pairs(model) for name in (pair.first, pair.second))

    def apply(self, model: onnx.ModelProto) -> onnx.ModelProto:
        return equalize(model)


TRANSFORMS: dict[str, Transform] = {"equalization": CrossLayerEqualization()}
"""The recovery transforms by name, in the order they apply."""


def applicable_transforms(model: onnx.ModelProto) -> tuple[str, ...]:
    """The names of :data:`TRANSFORMS` that change something in ``model``, in registry order."""
    return tuple(name for name, transform in TRANSFORMS.items() if transform.sites(model))


def apply_transforms(model: onnx.ModelProto, names: Collection[str]) -> onnx.ModelProto:
    """``model`` with the transforms ``names`` applied in registry order (``model`` itself for none).

    Raises:
        ValueError: If a name is not in :data:`TRANSFORMS`.
    """
    unknown = sorted(set(names) - set(TRANSFORMS))
    if unknown:
        raise ValueError(f"Unknown recovery transform(s) {unknown}; choose from {sorted(TRANSFORMS)}.")
    for name, transform in TRANSFORMS.items():
        if name in names:
            model = transform.apply(model)
    return model
