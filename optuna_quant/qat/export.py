"""Export a quantization-aware-trained model to ONNX QuantizeLinear/DequantizeLinear (QDQ).

Every enabled :class:`~optuna_quant.qat.tensor_quantizer.TensorQuantizer` becomes a QuantizeLinear ->
DequantizeLinear pair with constant int8 scale and zero point, which onnxruntime runs, fusing
the pairs around a Conv/MatMul into int8 kernels where it can.

Why the dynamo exporter (``torch.onnx.export(..., dynamo=True)``): in torch 2.13 the legacy
TorchScript exporter is deprecated; where it turns ``torch.fake_quantize_per_*_affine`` into QDQ
it leaves each scale as a Clip -> Div subgraph over the ``amax`` buffer, and it cannot trace the
settings that quantizers save in the state dict, so quantizers refuse it with a clear error. The
dynamo exporter folds scales into initializers, the form onnxruntime's QDQ fusions expect, and
keeps the batch size symbolic. torch's fake-quantization ops have no fake-tensor kernels, though,
so ``torch.export`` fails on them with a symbolic batch size: during a dynamo export the
quantizers emit the ONNX ops themselves (``torch.onnx.ops.symbolic``). The exporter writes
opset 18; a lower ``opset`` is converted down by ``onnx.version_converter`` (see
:func:`optuna_quant.quantization.torch_export.export_module`, which this module uses).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from optuna_quant.qat import calibrate, export_qat, quantize_modules
    >>> model = quantize_modules(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    >>> calibrate(model, [torch.randn(16, 4)])
    >>> onnx_model = export_qat(model, torch.randn(1, 4))
    >>> sorted({node.op_type for node in onnx_model.graph.node})
    ['DequantizeLinear', 'Gemm', 'QuantizeLinear', 'Relu']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
import torch
from torch import nn

from optuna_quant.qat.nn import named_quantizers
from optuna_quant.qat.tensor_quantizer import UncalibratedQuantizerError
from optuna_quant.quantization.torch_export import export_module
from optuna_quant.quantization.torch_export import NATIVE_OPSET


__all__ = ["export_qat"]


def export_qat(
    model: nn.Module, example_inputs: torch.Tensor | Sequence[torch.Tensor], path: str | Path | None = None,
    opset: int = NATIVE_OPSET, dynamic_batch: bool = True,
) -> onnx.ModelProto:
    """Export a calibrated QAT model (in eval mode) to an ONNX QDQ model.

    ``example_inputs``, ``path``, ``opset`` and ``dynamic_batch`` go to
    :func:`~optuna_quant.quantization.torch_export.export_module`, which documents them.

    Args:
        model: A model with :class:`TensorQuantizer` s (see ``quantize_modules``); its
            train/eval mode is restored afterwards. Disabled quantizers export nothing.

    Returns:
        The ONNX model.

    Raises:
        ValueError: The model has no quantizer, a quantizer is still calibrating or is not an
            8-bit fake quantizer, or see ``export_module``.
        UncalibratedQuantizerError: An enabled quantizer has no ``amax``; the message names it.
    """
    quantizers = named_quantizers(model)
    calibrating = [name for name, quantizer in quantizers.items() if quantizer.calibrating]
    if calibrating:
        raise ValueError(f"quantizers still calibrating: {', '.join(calibrating)}")
    enabled = {name: quantizer for name, quantizer in quantizers.items() if quantizer.enabled}
    uncalibrated = [name for name, quantizer in enabled.items() if quantizer.amax is None]
    if uncalibrated:
        raise UncalibratedQuantizerError(
            f"cannot export quantizers without amax: {', '.join(uncalibrated)}; calibrate or "
            "disable them"
        )
    unexportable = [
        name
        for name, quantizer in enabled.items()
        if quantizer.num_bits != 8 or not quantizer.fake_quant
    ]
    if unexportable:
        raise ValueError(
            f"ONNX QDQ needs 8-bit quantizers with fake_quant=True: {', '.join(unexportable)}"
        )
    onnx_model, _ = export_module(model, example_inputs, path, opset, dynamic_batch)
    return onnx_model
