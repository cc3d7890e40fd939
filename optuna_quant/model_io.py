"""Loading and checking the fp32 model and the data fed to it, before any long work starts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np
import onnx

ModelLike = Union[str, Path, onnx.ModelProto]
Feed = dict[str, np.ndarray]

_NUMPY_OF_ONNX = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
}
# Per-channel weight scales need QuantizeLinear's axis attribute, added in opset 13.
MIN_OPSET = 13


def load_model(model: ModelLike) -> onnx.ModelProto:
    """Load an ONNX model and check it, naming the file in every error.

    Unnamed nodes get a name (``<op_type>_<index>``), since fallback is chosen by node name.

    Raises:
        FileNotFoundError: If the path does not exist.
        ValueError: If the file is not a valid ONNX model or its opset is older than 13.

    Example:
        >>> load_model("missing.onnx")
        Traceback (most recent call last):
        ...
        FileNotFoundError: Model file 'missing.onnx' does not exist.
    """
    if isinstance(model, onnx.ModelProto):
        proto, where = onnx.ModelProto(), "The given ModelProto"
        proto.CopyFrom(model)
    else:
        path = Path(model)
        where = f"Model file {str(path)!r}"
        if not path.is_file():
            raise FileNotFoundError(f"{where} does not exist.")
        try:
            proto = onnx.load(str(path))
        except Exception as err:
            raise ValueError(f"{where} is not a readable ONNX model: {err}") from err
    try:
        onnx.checker.check_model(proto)
    except Exception as err:
        raise ValueError(f"{where} fails the ONNX checker: {err}") from err
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise ValueError(
            f"{where} uses opset {opset}; optuna-quant needs opset {MIN_OPSET} or later "
            "(onnx.version_converter.convert_version can upgrade it)."
        )
    for index, node in enumerate(proto.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
    return proto


def graph_inputs(model: onnx.ModelProto) -> dict[str, tuple[np.dtype, tuple[int | None, ...]]]:
    """The model's real inputs (initializers excluded): dtype and shape, ``None`` for free dims."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = np.dtype(_NUMPY_OF_ONNX.get(tensor.elem_type, np.float32))
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        inputs[value.name] = (dtype, dims)
    return inputs


def to_feeds(data: Iterable[Any], model: onnx.ModelProto, what: str = "calibration_data") -> list[Feed]:
    """Turn ``data`` into a list of input dicts checked against the model's inputs.

    Each item is a ``{input_name: array}`` dict, or a bare array for a single-input model.

    Raises:
        ValueError: If the data is empty, or an item's names, rank or fixed dimensions do not
            match the model's inputs; the message names the item and the input.
    """
    inputs = graph_inputs(model)
    feeds: list[Feed] = []
    for index, item in enumerate(data):
        if not isinstance(item, Mapping):
            if len(inputs) != 1:
                raise ValueError(
                    f"{what}[{index}] is a bare array but the model has inputs {sorted(inputs)}: "
                    "give a dict {input_name: array}."
                )
            item = {next(iter(inputs)): item}
        feeds.append(_check_feed(dict(item), inputs, f"{what}[{index}]"))
    if not feeds:
        raise ValueError(f"{what} is empty.")
    return feeds


def _check_feed(
    item: dict[str, Any], inputs: Mapping[str, tuple[np.dtype, tuple[int | None, ...]]], where: str
) -> Feed:
    if set(item) != set(inputs):
        raise ValueError(
            f"{where} has inputs {sorted(item)} but the model expects {sorted(inputs)}."
        )
    feed = {}
    for name, (dtype, dims) in inputs.items():
        array = np.asarray(item[name])
        if array.ndim != len(dims) or any(
            want is not None and got != want for got, want in zip(array.shape, dims)
        ):
            shown = tuple("?" if d is None else d for d in dims)
            raise ValueError(
                f"{where}: input {name!r} has shape {array.shape}, the model expects {shown}."
            )
        feed[name] = array.astype(dtype, copy=False)
    return feed


def batch_of(feeds: Sequence[Feed], size: int) -> Feed:
    """The first ``size`` samples of ``feeds`` (however they are batched) as one batch.

    Raises:
        ValueError: If ``feeds`` hold fewer than ``size`` samples.

    Example:
        >>> feeds = [{"x": np.zeros((4, 2))}, {"x": np.ones((4, 2))}]
        >>> batch_of(feeds, 1)["x"].shape, float(batch_of(feeds, 6)["x"].sum())
        ((1, 2), 4.0)
    """
    chosen, n = [], 0
    for feed in feeds:
        if n >= size:
            break
        chosen.append(feed)
        n += len(next(iter(feed.values())))
    if n < size:
        raise ValueError(f"A batch of {size} samples was asked for, but the data hold {n}.")
    return {name: np.concatenate([f[name] for f in chosen])[:size] for name in chosen[0]}
