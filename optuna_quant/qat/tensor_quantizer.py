"""Fake quantization of one tensor for quantization-aware training, after pytorch_quantization.

A :class:`TensorQuantizer` holds the range (``amax``) of one tensor and applies symmetric int8
fake quantization to it with ``torch.fake_quantize_per_tensor_affine`` or
``torch.fake_quantize_per_channel_affine``: the forward pass rounds to the int8 grid, the backward
pass is the straight-through estimator (gradient 1 inside the range, 0 outside), and both ops
export to ONNX ``QuantizeLinear``/``DequantizeLinear``.

Ranges come from max calibration: switch calibration on, run data, load the observed maxima
(:func:`optuna_quant.qat.calibrate` does that for every quantizer of a model).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


__all__ = ["TensorQuantizer", "UncalibratedQuantizerError"]

# A zero range (an all-zero weight channel, a dead activation) would give a zero scale, which
# neither torch's fake quantization nor ONNX QuantizeLinear accepts.
_MIN_AMAX = 1e-12
# The quantizer settings kept in the state dict next to ``amax``.
_SAVED_SETTINGS = ("num_bits", "unsigned", "narrow_range", "axis")


class UncalibratedQuantizerError(RuntimeError):
    """A quantizer was asked to quantize before it had a range (``amax``)."""


class TensorQuantizer(nn.Module):
    """Symmetric fake quantization of one tensor, per tensor or per channel.

    The quantizer has three modes, checked in this order:

    * calibrating (:meth:`enable_calib`): records the running maximum of ``|x|`` and returns ``x``
      unchanged; :meth:`load_calib_amax` then copies that maximum into ``amax``;
    * disabled (:meth:`disable`): returns ``x`` unchanged;
    * enabled (the default): quantizes ``x`` with the scale ``amax / bound``. With ``fake_quant``
      (the default) the result is dequantized again (float values on the int grid); without it the
      result holds the integer codes, which is for inspection only.

    ``narrow_range`` uses [-127, 127] instead of [-128, 127] for signed types, so that the grid is
    symmetric. ONNX has no narrow int8 type, so during ONNX export the full [-128, 127] range is
    used with the same scale; the two differ only for values below ``-amax``, which a weight
    written back by ``quant_weight_inplace`` never has.

    Args:
        num_bits: Bits of the integer type; ONNX export needs 8.
        unsigned: Quantize to [0, 2**num_bits - 1] (for non-negative inputs) instead of signed.
        narrow_range: Drop the most negative signed code (see above).
        axis: ``None`` for one range for the whole tensor, or the dimension that gets one range
            per index (0, the output channels, for weights).

    Attributes:
        amax: The range: a scalar, or one value per index of ``axis``; ``None`` until calibrated.
        enabled: Whether ``forward`` quantizes when not calibrating (:meth:`enable`, :meth:`disable`).
        calibrating: Whether ``forward`` records ranges instead (:meth:`enable_calib`).
        fake_quant: Whether quantized values are dequantized again (see above).

    Example:
        >>> import torch
        >>> q = TensorQuantizer()
        >>> q.enable_calib()
        >>> _ = q(torch.tensor([-0.5, 1.27]))
        >>> q.load_calib_amax()
        >>> q.disable_calib()
        >>> q(torch.tensor([0.013, 2.0]))
        tensor([0.0100, 1.2700])
    """

    amax: torch.Tensor | None

    def __init__(
        self,
        num_bits: int = 8,
        unsigned: bool = False,
        narrow_range: bool = True,
        axis: int | None = None,
    ) -> None:
        super().__init__()
        if not 2 <= num_bits <= 16:
            raise ValueError(f"num_bits must be between 2 and 16, got {num_bits}")
        self.num_bits = num_bits
        self.unsigned = unsigned
        self.narrow_range = narrow_range
        self.axis = axis
        self.fake_quant = True
        self.enabled = True
        self.calibrating = False
        self._calib_amax: torch.Tensor | None = None
        self._calib_negative = False
        self.register_buffer("amax", None)

    # -- modes -------------------------------------------------------------------------------

    def enable(self) -> None:
        """Quantize in ``forward``."""
        self.enabled = True

    def disable(self) -> None:
        """Pass inputs through unchanged in ``forward``."""
        self.enabled = False

    def enable_calib(self) -> None:
        """Record ``max(|x|)`` in ``forward`` (which then returns ``x`` unchanged)."""
        self.calibrating = True

    def disable_calib(self) -> None:
        """Stop recording; the recorded maximum stays until :meth:`load_calib_amax`."""
        self.calibrating = False

    @property
    def has_calib_data(self) -> bool:
        """Whether data was recorded since the last :meth:`load_calib_amax`."""
        return self._calib_amax is not None

    def load_calib_amax(self, unsigned_if_nonnegative: bool = False) -> None:
        """Use the maximum recorded since the last load as ``amax``, and forget the record.

        Args:
            unsigned_if_nonnegative: Also make the quantizer unsigned when no recorded value was
                negative (see :func:`calibrate`).

        Raises:
            UncalibratedQuantizerError: No data went through the quantizer while calibrating.
        """
        if self._calib_amax is None:
            raise UncalibratedQuantizerError(
                "load_calib_amax() found no recorded range: call enable_calib() and run data "
                "through the quantizer first"
            )
        self.amax = self._calib_amax
        if unsigned_if_nonnegative and not self._calib_negative:
            self.unsigned = True
        self._calib_amax = None
        self._calib_negative = False

    # -- quantization ------------------------------------------------------------------------

    @property
    def bound(self) -> int:
        """Largest integer code: 127 for signed 8 bits, 255 for unsigned."""
        return (1 << (self.num_bits - 1 + int(self.unsigned))) - 1

    def quant_range(self) -> tuple[int, int]:
        """The ``(quant_min, quant_max)`` codes, e.g. ``(-127, 127)`` with ``narrow_range``."""
        if self.unsigned:
            return 0, self.bound
        if self.narrow_range:
            return -self.bound, self.bound
        return -self.bound - 1, self.bound

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.calibrating:
            self._record(x)
            return x
        if not self.enabled:
            return x
        if self.amax is None:
            raise UncalibratedQuantizerError(
                "This TensorQuantizer has no amax: calibrate it (optuna_quant.qat.calibrate, or "
                "enable_calib() / load_calib_amax()) or disable() it before quantizing"
            )
        scale = self.amax.float().clamp_min(_MIN_AMAX) / self.bound
        if torch.onnx.is_in_onnx_export():
            return self._export_qdq(x, scale)
        quant_min, quant_max = self.quant_range()
        if not self.fake_quant:
            codes_scale = scale if self.axis is None else _along(scale, self.axis, x.dim())
            # Multiplying by the inverse, as torch's fake quantization does, rounds ties alike.
            return torch.clamp(torch.round(x * (1.0 / codes_scale)), quant_min, quant_max)
        if self.axis is None:
            zero_point = torch.zeros((), dtype=torch.int32, device=x.device)
            return torch.fake_quantize_per_tensor_affine(
                x, scale, zero_point, quant_min, quant_max
            )
        zero_point = torch.zeros(scale.shape, dtype=torch.int32, device=x.device)
        return torch.fake_quantize_per_channel_affine(
            x, scale, zero_point, self.axis, quant_min, quant_max
        )

    def _export_qdq(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """QuantizeLinear -> DequantizeLinear for ``torch.onnx.export``."""
        if self.num_bits != 8 or not self.fake_quant:
            raise ValueError("ONNX export needs 8-bit quantizers with fake_quant=True")
        # torch 2.13's fake quantization ops have no fake-tensor kernels, so torch.export (the
        # dynamo exporter) fails on them with a symbolic batch size: emit the ONNX ops directly.
        int_dtype = torch.uint8 if self.unsigned else torch.int8
        zero_point = torch.zeros(scale.shape, dtype=int_dtype, device=x.device)
        attrs = {} if self.axis is None else {"axis": self.axis}
        codes = torch.onnx.ops.symbolic(
            "QuantizeLinear", (x, scale, zero_point), attrs, dtype=int_dtype, shape=x.shape
        )
        return torch.onnx.ops.symbolic(
            "DequantizeLinear", (codes, scale, zero_point), attrs, dtype=x.dtype, shape=x.shape
        )

    def _record(self, x: torch.Tensor) -> None:
        with torch.no_grad():
            if self.axis is None:
                amax = x.abs().amax()
            else:
                dims = [d for d in range(x.dim()) if d != self.axis % x.dim()]
                amax = x.abs().amax(dim=dims)
            amax = amax.float()
            self._calib_negative = self._calib_negative or bool((x < 0).any())
            if self._calib_amax is not None:
                amax = torch.maximum(self._calib_amax, amax)
            self._calib_amax = amax

    def get_extra_state(self) -> dict[str, Any]:
        # Saved with the state dict because calibrate() may change ``unsigned``.
        if torch.onnx.is_in_onnx_export():
            # Only the legacy TorchScript exporter reads the state dict, and it takes tensors only.
            raise RuntimeError(
                "TensorQuantizer does not support the legacy ONNX exporter (dynamo=False): use "
                "optuna_quant.qat.export_qat or torch.onnx.export(..., dynamo=True)"
            )
        return {name: getattr(self, name) for name in _SAVED_SETTINGS}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        for name in _SAVED_SETTINGS:
            setattr(self, name, state[name])

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # ``amax`` starts as None, which load_state_dict would skip: give it the saved shape first.
        saved = state_dict.get(prefix + "amax")
        if saved is not None and self.amax is None:
            self.amax = torch.empty_like(saved)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        kind = "per-tensor" if self.axis is None else f"per-channel(axis={self.axis})"
        sign = "unsigned" if self.unsigned else "signed"
        state = "calibrating" if self.calibrating else ("on" if self.enabled else "off")
        amax = "none" if self.amax is None else f"{self.amax.min():.4g}..{self.amax.max():.4g}"
        return f"{self.num_bits}-bit {sign} {kind}, {state}, amax={amax}"


def _along(values: torch.Tensor, axis: int, ndim: int) -> torch.Tensor:
    """Reshape per-channel ``values`` to broadcast along ``axis`` of an ``ndim`` tensor."""
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return values.reshape(shape)
