"""Loading and checking the fp32 model and the data fed to it, before any long work starts."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Union

import numpy as np
import onnx


ModelLike = Union[str, Path, onnx.ModelProto]
Feed = dict[str, np.ndarray]

# Per-channel weight scales need QuantizeLinear's axis attribute, added in opset 13.
MIN_OPSET = 13


def opset_of(model: onnx.ModelProto) -> int:
    """The model's version of the default (``ai.onnx``) operator set."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def name_nodes(model: onnx.ModelProto) -> None:
    """Name every unnamed top-level node ``<op_type>_<index>``, in place: fallback goes by name."""
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"


def _unloaded_external_data(model: onnx.ModelProto) -> list[str]:
    return [
        init.name
        for init in model.graph.initializer
        if init.data_location == onnx.TensorProto.EXTERNAL and not init.raw_data
    ]


@dataclass(frozen=True)
class LoadedModel:
    """A model as :func:`load_checked` returns it, with the bytes it was checked as.

    Attributes:
        proto: The model, every top-level node named.
        serialized: ``proto`` serialized, made once: a session, a hash or a file written from it
            need not serialize the model again (what that costs: docs/models.md).
    """

    proto: onnx.ModelProto
    serialized: bytes


def load_model(model: ModelLike) -> onnx.ModelProto:
    """Load an ONNX model and check it, naming the file in every error.

    Unnamed nodes get a name (``<op_type>_<index>``), since fallback is chosen by node name.
    Weights saved as external data are loaded from beside the file. Any opset is accepted:
    :func:`optuna_quant.quantization.prepare.prepare_model` upgrades older ones for quantization.

    Raises:
        FileNotFoundError: If the path does not exist.
        ValueError: If the file is not a valid ONNX model, or a ``ModelProto`` refers to external
            data that was not loaded.

    Example:
        >>> load_model("missing.onnx")
        Traceback (most recent call last):
        ...
        FileNotFoundError: Model file 'missing.onnx' does not exist.
    """
    return load_checked(model).proto


def load_checked(model: ModelLike) -> LoadedModel:
    """:func:`load_model`, keeping the serialized model it checked.

    Raises:
        FileNotFoundError, ValueError: As :func:`load_model`.

    Example:
        >>> loaded = load_checked(onnx.helper.make_model(onnx.helper.make_graph([], "empty", [], [])))
        >>> onnx.ModelProto.FromString(loaded.serialized) == loaded.proto
        True
    """
    if isinstance(model, onnx.ModelProto):
        proto, where = onnx.ModelProto(), "The given ModelProto"
        proto.CopyFrom(model)
        unloaded = _unloaded_external_data(proto)
        if unloaded:
            raise ValueError(
                f"{where} keeps {len(unloaded)} weights (e.g. {unloaded[0]!r}) in external data files "
                "that were not loaded: pass the model's path instead, or onnx.load it with its data."
            )
    else:
        path = Path(model)
        where = f"Model file {str(path)!r}"
        if not path.is_file():
            raise FileNotFoundError(f"{where} does not exist.")
        try:
            proto = onnx.load(str(path))
        except Exception as err:
            raise ValueError(f"{where} is not a readable ONNX model: {err}") from err
    name_nodes(proto)  # names change nothing the checker reads
    try:
        serialized = proto.SerializeToString()
    except ValueError as err:  # protobuf's 2 GB limit: sessions are built from these bytes too
        raise ValueError(f"{where} does not serialize as one protobuf: {err}") from err
    try:
        onnx.checker.check_model(serialized)  # the bytes: checking the proto would serialize it again
    except Exception as err:
        raise ValueError(f"{where} fails the ONNX checker: {err}") from err
    return LoadedModel(proto, serialized)


def graph_inputs(model: onnx.ModelProto) -> dict[str, tuple[np.dtype, tuple[int | None, ...]]]:
    """The model's real inputs (initializers excluded): dtype and shape, ``None`` for free dims.

    A dimension is free when it is symbolic (``dim_param``), missing, or not positive: exporters
    such as paddle2onnx write ``dim_value: -1`` for a dynamic size.
    """
    initializers = {init.name for init in model.graph.initializer}
    inputs = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim)
        inputs[value.name] = (dtype, dims)
    return inputs


def to_feeds(data: Iterable[Any], model: onnx.ModelProto, what: str = "calibration_data") -> list[Feed]:
    """Turn ``data`` into a list of input dicts checked against the model's inputs.

    Each item is a ``{input_name: array}`` dict, or a bare array for a single-input model.

    Float data is cast to the input's float type. Integer data for a float input is refused
    rather than cast: uint8 images of 0 to 255 fed to a model that expects normalized floats
    calibrate every range wrong (the reference then loses almost all its accuracy). Float data
    for an integer input is refused unless every value is a whole number.

    Raises:
        ValueError: If the data is empty, or an item's names, rank, fixed dimensions or dtype do
            not match the model's inputs; the message names the item and the input.

    Example:
        >>> from onnx import helper, TensorProto
        >>> graph = helper.make_graph(
        ...     [helper.make_node("Relu", ["x"], ["y"])], "g",
        ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4])],
        ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])])
        >>> model = helper.make_model(graph)
        >>> to_feeds([np.zeros((3, 4), np.float64)], model)[0]["x"].dtype
        dtype('float32')
        >>> to_feeds([np.full((1, 4), 255, np.uint8)], model)
        Traceback (most recent call last):
        ...
        ValueError: calibration_data[0]: input 'x' is float32 but the data is uint8 (values 255 to 255); ...
    """
    inputs = graph_inputs(model)
    feeds = [_check_feed(item, inputs, f"{what}[{index}]") for index, item in enumerate(data)]
    if not feeds:
        raise ValueError(f"{what} is empty.")
    return feeds


def to_feed(item: Any, model: onnx.ModelProto, what: str) -> Feed:
    """One input dict (or a bare array, single input) checked against the model's inputs as
    :func:`to_feeds` checks each item; the messages name ``what``.

    Example:
        >>> from onnx import helper, TensorProto
        >>> graph = helper.make_graph(
        ...     [helper.make_node("Relu", ["x"], ["y"])], "g",
        ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
        >>> to_feed({"x": np.zeros((8, 4))}, helper.make_model(graph), "latency_data")["x"].shape
        (8, 4)
        >>> to_feed({"x": np.zeros((8, 5))}, helper.make_model(graph), "latency_data")
        Traceback (most recent call last):
        ...
        ValueError: latency_data: input 'x' has shape (8, 5), the model expects ('?', 4).
    """
    return _check_feed(item, graph_inputs(model), what)


def _check_feed(item: Any, inputs: Mapping[str, tuple[np.dtype, tuple[int | None, ...]]], where: str) -> Feed:
    if not isinstance(item, Mapping):
        if len(inputs) != 1:
            raise ValueError(
                f"{where} is a bare array but the model has inputs {sorted(inputs)}: give a dict {{input_name: array}}."
            )
        item = {next(iter(inputs)): item}
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
        feed[name] = array.astype(_checked_dtype(array, dtype, f"{where}: input {name!r}"), copy=False)
    return feed


def _checked_dtype(array: np.ndarray, dtype: np.dtype, where: str) -> np.dtype:
    got = array.dtype
    if dtype.kind == "f" and got.kind in "biu":
        low, high = (array.min(), array.max()) if array.size else (0, 0)
        raise ValueError(
            f"{where} is {dtype} but the data is {got} (values {low} to {high}); optuna-quant does "
            f"not guess the scaling: give {dtype} data preprocessed as the model expects it (for "
            f"images often array.astype(np.{dtype}) / 255, or normalized by mean and std)."
        )
    if dtype.kind in "iu" and got.kind == "f" and not np.all(np.mod(array, 1) == 0):
        raise ValueError(f"{where} is {dtype} but the data is {got} with fractional values.")
    return dtype


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
