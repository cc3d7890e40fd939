"""Export a PyTorch module to ONNX for the tuner, keeping track of which module made which node.

The tuner quantizes ONNX nodes, but a user thinks in modules: the mapping returned by
:func:`export_module` lets a result say that ``node_conv2d_3`` (``layers.1.0.conv``) stayed fp32.

The export uses torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``), the default
since torch 2.9, because it (a) names initializers after the module's parameters, (b) records
each node's module scope in the ``pkg.torch.onnx.name_scopes`` metadata property and
(c) constant-folds quantization scales into initializers, which onnxruntime needs to fuse
QuantizeLinear/DequantizeLinear pairs into int8 kernels. The legacy TorchScript exporter is
deprecated in torch 2.13 and encodes scopes only in node names such as
``/layers.0/layers.0.0/conv/Conv``, where the segments mix qualified and relative names.

The dynamo exporter has no implementations below opset 18, hence the default. A lower ``opset``
is exported at 18 and converted down with ``onnx.version_converter``, as torch itself does; the
conversion drops node metadata but keeps node names, so the mapping is read from the opset-18
graph first. The conversion is unreliable (onnx 1.23 has no adapter from Relu-14 to 13 nor from
Pad-18 to 17, and it leaves ReduceMean-18's ``noop_with_empty_axes`` on ReduceMean-17, which
onnxruntime rejects), so the converted model is checked and a failure raises instead of
returning an invalid model.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 10))
    >>> onnx_model, modules = export_module(model, torch.randn(2, 1, 8, 8))
    >>> sorted(modules.values())
    ['0', '3']
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import onnx
import onnx.version_converter
import torch
from torch import nn

from optuna_quant.quantization.config import QUANTIZABLE_OP_TYPES
from optuna_quant.quantization.model_io import MIN_OPSET


__all__ = ["QUANTIZABLE_OP_TYPES", "export_module"]

NATIVE_OPSET = 18
"""The lowest opset the dynamo exporter emits directly (torch 2.13), and the default: converting
down to a lower one fails for some models."""
_NAME_SCOPES = "pkg.torch.onnx.name_scopes"


def export_module(
    module: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    path: str | Path | None = None,
    opset: int = NATIVE_OPSET,
    dynamic_batch: bool = True,
) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Export ``module`` in eval mode to ONNX and map its quantizable nodes to module names.

    Args:
        module: The model; its train/eval mode is restored afterwards.
        example_inputs: One tensor, or a sequence of tensors passed as positional arguments.
        path: Where to save the model as well, if given.
        opset: ONNX opset, at least 13 (per-channel quantization needs it); below 18 the model
            is converted down, which fails for some models (see the module docstring).
        dynamic_batch: Export the first dimension of every input as symbolic, so that the model
            runs on any batch size (unless the model's code fixes it).

    Returns:
        The ONNX model, and for each Conv, ConvTranspose, MatMul and Gemm node that can be traced
        to a module, ``{node name: qualified module name}`` (``""`` for the root module, as in
        ``named_modules()``). A node whose weight is an initializer named after a parameter maps
        to that parameter's module, even when the exporter fused a BatchNorm into it; other
        nodes map to the innermost module whose ``forward`` created them.

    Raises:
        TypeError: ``module`` is not an ``nn.Module`` or ``example_inputs`` holds a non-tensor.
        ValueError: ``opset`` is below 13, the module fails on ``example_inputs``, or the model
            cannot be converted down to ``opset``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> _, modules = export_module(model, torch.randn(3, 4))
        >>> modules
        {'node_linear': '0', 'node_linear_1': '2'}
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    args = _as_args(example_inputs)
    if opset < MIN_OPSET:
        raise ValueError(f"opset must be at least {MIN_OPSET} (per-channel Q/DQ), got {opset}")

    was_training = module.training
    module.eval()
    try:
        _check_forward(module, args)
        program = torch.onnx.export(
            module,
            args,
            dynamo=True,
            opset_version=max(opset, NATIVE_OPSET),
            dynamic_shapes=_batch_dims(args) if dynamic_batch else None,
            verbose=False,
        )
    finally:
        module.train(was_training)
    model = program.model_proto
    node_modules = _node_modules(model, module)
    if opset < NATIVE_OPSET:
        model = _convert_opset(model, opset)
        kept = {node.name for node in model.graph.node}
        node_modules = {name: owner for name, owner in node_modules.items() if name in kept}
    if path is not None:
        onnx.save(model, str(path))
    return model, node_modules


def _as_args(example_inputs: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)) or not example_inputs:
        raise TypeError(
            "example_inputs must be a tensor or a non-empty tuple/list of tensors, got "
            f"{type(example_inputs).__name__}"
        )
    for i, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"example_inputs[{i}] must be a torch.Tensor, got {type(value).__name__}"
            )
    return tuple(example_inputs)


def _check_forward(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    # The exporter buries a shape mismatch under pages of tracing errors; a plain call does not.
    try:
        with torch.no_grad():
            module(*args)
    except Exception as err:
        shapes = ", ".join(str(tuple(arg.shape)) for arg in args)
        raise ValueError(
            f"the module fails on example_inputs of shapes {shapes}: {err}"
        ) from err


def _batch_dims(args: tuple[torch.Tensor, ...]) -> tuple[dict[int, object] | None, ...]:
    # AUTO rather than DYNAMIC: a model that fixes its batch size exports static instead of failing.
    return tuple({0: torch.export.Dim.AUTO} if arg.dim() > 0 else None for arg in args)


def _node_modules(model: onnx.ModelProto, module: nn.Module) -> dict[str, str]:
    """``{node name: module name}`` for the quantizable nodes of a dynamo-exported model."""
    param_owner = {name: name.rpartition(".")[0] for name, _ in module.named_parameters()}
    module_names = {name for name, _ in module.named_modules()}
    mapping: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type not in QUANTIZABLE_OP_TYPES:
            continue
        owner = next((param_owner[name] for name in node.input if name in param_owner), None)
        if owner is None:
            owner = _scope_owner(node, module_names)
        if owner is not None:
            mapping[node.name] = owner
    return mapping


def _scope_owner(node: onnx.NodeProto, module_names: set[str]) -> str | None:
    """The innermost module in the node's name-scope metadata (the last scope is the op)."""
    props = {prop.key: prop.value for prop in node.metadata_props}
    if _NAME_SCOPES not in props:
        return None
    scopes = ast.literal_eval(props[_NAME_SCOPES])
    return next((scope for scope in reversed(scopes[:-1]) if scope in module_names), None)


def _convert_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    try:
        converted = onnx.version_converter.convert_version(model, opset)
        onnx.checker.check_model(converted)
        return converted
    except Exception as err:
        raise ValueError(
            f"the exporter writes opset {NATIVE_OPSET} and onnx could not convert this model to "
            f"a valid opset-{opset} model ({err}); pass opset={NATIVE_OPSET}"
        ) from err
