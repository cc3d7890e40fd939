"""Quantization-aware training helpers after pytorch_quantization.

``tensor_quantizer`` has the fake quantization of one tensor, ``nn`` the fake-quantized layers
and their calibration, ``helper`` the parameter selection for fine-tuning (``match_parameters``,
``group_parameters``, ``freeze_parameters``, ``quant_weight_inplace``) and ``export`` the ONNX
QDQ export.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from optuna_quant import qat
    >>> model = qat.quantize_modules(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    >>> qat.calibrate(model, [torch.randn(16, 4)])
    >>> optimizer = torch.optim.SGD(qat.group_parameters(model, [["weight"], ["bias"]]), lr=1e-3)
"""

from __future__ import annotations

from optuna_quant.qat.export import export_qat
from optuna_quant.qat.helper import freeze_parameters
from optuna_quant.qat.helper import group_parameters
from optuna_quant.qat.helper import match_parameters
from optuna_quant.qat.helper import quant_weight_inplace
from optuna_quant.qat.nn import calibrate
from optuna_quant.qat.nn import named_quantizers
from optuna_quant.qat.nn import QuantConv2d
from optuna_quant.qat.nn import quantize_modules
from optuna_quant.qat.nn import QuantLinear
from optuna_quant.qat.tensor_quantizer import TensorQuantizer
from optuna_quant.qat.tensor_quantizer import UncalibratedQuantizerError


__all__ = [
    "QuantConv2d",
    "QuantLinear",
    "TensorQuantizer",
    "UncalibratedQuantizerError",
    "calibrate",
    "export_qat",
    "freeze_parameters",
    "group_parameters",
    "match_parameters",
    "named_quantizers",
    "quant_weight_inplace",
    "quantize_modules",
]
