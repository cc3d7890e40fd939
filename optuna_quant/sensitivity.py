"""Per-layer sensitivity: what int8 costs each searchable layer in accuracy, and what it saves in time.

Measured once per study, before the search:

- **Accuracy.** The error of the final outputs against the fp32 model on calibration data, as a
  noise-to-signal ratio ``||y_int8 - y_fp32||^2 / ||y_fp32||^2`` summed over the outputs
  (:func:`output_error`). Quantization noise of independent layers adds up in that ratio, so the
  per-layer figures add up to predict a configuration. Two figures per layer: the error when only
  that layer is int8 (``error_alone``), and how much error keeping only that layer in fp32
  removes from the all-int8 model (``error_recovered``). :attr:`LayerSensitivity.acc_cost` is the
  one that predicted the measured accuracy loss of configurations better (see docs).
- **Time.** onnxruntime's profiler (``SessionOptions.enable_profiling``) on the fp32 and the
  all-int8 model: the median time of each node of the optimized graph, mapped back to the layer
  it came from (:func:`layer_of`). onnxruntime fuses ``DequantizeLinear -> Conv -> QuantizeLinear``
  into ``QLinearConv`` (named ``<layer>_token_<n>``) and fp32 ``Conv -> Relu`` into an NCHWc
  ``Conv`` named after the Relu's output, so a node is charged to a layer by its name
  (``<layer>`` or ``<layer>_...``) or else by a weight or bias of the layer among its inputs
  (``<initializer>`` or ``<initializer>_...``). A node with a single data input that neither maps
  (the int8 model's Relu and QuantizeLinear after a layer, a layout reorder) is charged to the
  layer of that input's producer, since the fp32 model fuses the Relu into the layer. What stays
  unattributed (the graph input's QuantizeLinear, nodes with several data inputs such as Add or
  Concat, and what they feed) is reported by the log line as the models' unattributed node time.

:func:`choice_scores` turns the result into a prior for samplers (parameter -> choice -> score), and
:func:`revert_order` into the order in which start-up trials put layers back to fp32.

Example:
    >>> sens = measure_sensitivity(model, quantizer, feeds, space.nodes)    # doctest: +SKIP
    >>> revert_order(sens)[:2]                                               # doctest: +SKIP
    ['/6/Conv', '/0/Conv']
    >>> choice_scores(sens)["layer:/6/Conv"]                                 # doctest: +SKIP
    {'int8': 0.1, 'fp32': 0.9}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
import json
import logging
from pathlib import Path
import tempfile
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from optuna_quant.latency import BenchmarkSettings
from optuna_quant.model_io import Feed
from optuna_quant.quantize import Quantizer
from optuna_quant.space import LAYER_PREFIX
from optuna_quant.space import QuantConfig

_logger = logging.getLogger(__name__)

PROFILE_SUFFIX = "_kernel_time"
SCORE_RANGE = (0.1, 0.9)
"""The lowest and highest score :func:`choice_scores` gives a choice: a prior, never a verdict."""


@dataclass(frozen=True)
class LayerSensitivity:
    """How much one layer's int8 costs and saves.

    Attributes:
        error_alone: Output noise-to-signal ratio when only this layer of the searched ones is int8.
        error_recovered: Output noise-to-signal ratio that keeping only this layer in fp32 removes
            from the all-int8 model (negative when it adds some).
        fp32_ms: This layer's node time in the fp32 model, per run, in milliseconds.
        int8_ms: This layer's node time in the all-int8 model (its int8 kernel and the Q/DQ
            named after it), per run, in milliseconds.
    """

    error_alone: float
    error_recovered: float
    fp32_ms: float
    int8_ms: float

    @property
    def acc_cost(self) -> float:
        """What int8 costs this layer in accuracy: :attr:`error_alone` (the better predictor)."""
        return self.error_alone

    @property
    def time_saved_ms(self) -> float:
        """Time int8 saves on this layer per run (negative when it is slower than fp32)."""
        return self.fp32_ms - self.int8_ms

    def to_dict(self) -> dict[str, float]:
        """The measurement as a JSON-serialisable dict (a study user attr)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerSensitivity:
        """The measurement stored by :meth:`to_dict`."""
        return cls(**{key: float(data[key]) for key in cls.__dataclass_fields__})


def output_error(reference: Sequence[Sequence[np.ndarray]], outputs: Sequence[Sequence[np.ndarray]]) -> float:
    """Noise-to-signal ratio of ``outputs`` against ``reference``: ``sum ||y - y_ref||^2 / sum ||y_ref||^2``.

    Both are lists (one item per sample) of the model's outputs.

    Example:
        >>> output_error([[np.array([3.0, 4.0])]], [[np.array([3.0, 3.0])]])
        0.04
    """
    pairs = [
        (np.asarray(y, np.float64), np.asarray(r, np.float64))
        for ys, rs in zip(outputs, reference)
        for y, r in zip(ys, rs)
    ]
    noise = sum(float(np.sum((y - r) ** 2)) for y, r in pairs)
    signal = sum(float(np.sum(r**2)) for _, r in pairs)
    return noise / signal if signal > 0 else noise


def layer_of(node: onnx.NodeProto, layers: Mapping[str, Iterable[str]]) -> str | None:
    """The layer that a node of onnxruntime's optimized graph computes, or ``None``.

    Args:
        node: A node of the optimized graph.
        layers: For each layer, the names of its initializers (weight, bias).

    Example:
        >>> from onnx import helper
        >>> layers = {"/0/Conv": ["0.weight", "0.bias"], "/2/Conv": ["2.weight"]}
        >>> fused = helper.make_node("QLinearConv", ["x", "s", "z", "2.weight_quantized"], ["y"], name="/2/Conv_token_1")
        >>> layer_of(fused, layers)
        '/2/Conv'
        >>> layer_of(helper.make_node("Conv", ["x", "reorder", "0.bias"], ["y"], name="/1/Relu_output_0_nchwc"), layers)
        '/0/Conv'
        >>> layer_of(helper.make_node("Relu", ["x"], ["y"], name="/1/Relu"), layers) is None
        True
    """
    for layer in layers:
        if node.name == layer or node.name.startswith(layer + "_"):
            return layer
    for layer, initializers in layers.items():
        for name in node.input:
            if any(name == init or name.startswith(init + "_") for init in initializers):
                return layer
    return None


def _initializers_of(model: onnx.ModelProto, nodes: Iterable[str]) -> dict[str, list[str]]:
    initializers = {init.name for init in model.graph.initializer}
    by_name = {n.name: n for n in model.graph.node}
    return {name: [i for i in by_name[name].input if i in initializers] for name in nodes}


def _owners(graph: onnx.GraphProto, layers: Mapping[str, Iterable[str]]) -> dict[str, str | None]:
    """The layer of each node of an optimized graph (in topological order): its own by
    :func:`layer_of`, else, for a node with a single data input, that input's producer's."""
    constants = {init.name for init in graph.initializer}
    producer: dict[str, str] = {}
    owner: dict[str, str | None] = {}
    for node in graph.node:
        layer = layer_of(node, layers)
        data = [name for name in node.input if name and name not in constants]
        if layer is None and len(data) == 1 and data[0] in producer:
            # What onnxruntime leaves between fused kernels (the int8 model's Relu and its
            # QuantizeLinear, a layout reorder) continues the layer whose output it carries on,
            # as the Relu fused into the fp32 Conv is part of that layer.
            layer = owner[producer[data[0]]]
        owner[node.name] = layer
        producer.update(dict.fromkeys(node.output, node.name))
    return owner


def profile_layers(
    model: onnx.ModelProto,
    feed: Feed,
    layers: Mapping[str, Iterable[str]],
    settings: BenchmarkSettings,
    runs: int,
) -> tuple[dict[str, float], float]:
    """Per-layer node time of ``model`` on ``feed`` by onnxruntime's profiler, per run, in ms.

    Args:
        model: The model to profile.
        feed: One input dict.
        layers: For each layer, its initializers' names (see :func:`layer_of`).
        settings: The threads to run on.
        runs: Profiled runs, after as many untimed ones; each node's median counts.

    Returns:
        The time of each layer (0 for a layer without a node), and the unattributed node time.
    """
    with tempfile.TemporaryDirectory(prefix="optuna-quant-profile-") as folder:
        options = settings.session_options()
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for _ in range(2 * runs):  # the first half warms up; only the second half is kept
            session.run(None, feed)
        trace = json.loads(Path(session.end_profiling()).read_text())
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    durations: dict[str, list[float]] = {}
    for event in trace:
        if event.get("cat") == "Node" and event["name"].endswith(PROFILE_SUFFIX):
            durations.setdefault(event["name"].removesuffix(PROFILE_SUFFIX), []).append(event["dur"])
    owner = _owners(optimized.graph, layers)
    per_layer = dict.fromkeys(layers, 0.0)
    unattributed = 0.0
    for name, micros in durations.items():
        ms = float(np.median(micros[len(micros) // 2 :])) / 1000
        layer = owner.get(name)
        if layer is None:
            unattributed += ms
        else:
            per_layer[layer] += ms
    return per_layer, unattributed


def measure_sensitivity(
    fp32_model: onnx.ModelProto,
    quantizer: Quantizer,
    feeds: Sequence[Feed],
    nodes: Sequence[str],
    *,
    base_config: QuantConfig | None = None,
    n_samples: int = 32,
    profile_runs: int = 20,
    settings: BenchmarkSettings | None = None,
) -> dict[str, LayerSensitivity]:
    """Measure every layer of ``nodes`` once: its accuracy cost and the time int8 saves on it.

    Args:
        fp32_model: The fp32 model that ``quantizer`` quantizes.
        quantizer: Builds the int8 models (cached calibration).
        feeds: Input dicts; the first ``n_samples`` measure the output error, the first is profiled.
        nodes: The searchable layers; the others keep ``base_config``'s choice throughout.
        base_config: The all-int8 configuration (the reference; default :class:`QuantConfig`).
        n_samples: Feeds on which the output error is measured.
        profile_runs: Profiled runs of each of the fp32 and the all-int8 models.
        settings: Threads for every session (default :class:`BenchmarkSettings`).

    Returns:
        The sensitivity of each layer, by name, in the order of ``nodes``.

    Raises:
        ValueError: If ``nodes`` is empty, names a node the model lacks, or ``n_samples`` or
            ``profile_runs`` is not positive; raised before any measurement.
    """
    base = base_config or QuantConfig()
    settings = settings or BenchmarkSettings()
    names = [n.name for n in fp32_model.graph.node]
    missing = [n for n in nodes if n not in names]
    if not nodes or missing:
        raise ValueError(f"nodes must name nodes of the model; missing: {missing or 'all (none given)'}.")
    for name, value in (("n_samples", n_samples), ("profile_runs", profile_runs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    samples = list(feeds[:n_samples])
    _logger.info("Measuring the sensitivity of %d layers on %d samples", len(nodes), len(samples))
    start = time.perf_counter()

    def run(model: onnx.ModelProto) -> list[list[np.ndarray]]:
        options = settings.session_options()
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return [session.run(None, feed) for feed in samples]

    def error(fallback: Iterable[str]) -> float:
        config = replace(base, fallback=frozenset(base.fallback | set(fallback)))
        return output_error(reference, run(quantizer.quantize(config)))

    reference = run(fp32_model)
    all_int8 = quantizer.quantize(base)
    base_error = output_error(reference, run(all_int8))
    alone = {n: error(set(nodes) - {n}) for n in nodes}
    recovered = {n: base_error - error({n}) for n in nodes}
    measured = time.perf_counter()
    layers = _initializers_of(fp32_model, nodes)
    fp32_ms, fp32_rest = profile_layers(fp32_model, samples[0], layers, settings, profile_runs)
    int8_ms, int8_rest = profile_layers(all_int8, samples[0], layers, settings, profile_runs)
    sens = {n: LayerSensitivity(alone[n], recovered[n], fp32_ms[n], int8_ms[n]) for n in nodes}
    _logger.info(
        "Measured the sensitivity of %d layers in %.1f s (output errors %.1f s, profiles %.1f s): "
        "all-int8 error %.3g; layer node time fp32 %.3f ms, int8 %.3f ms; unattributed %.3f ms and %.3f ms",
        len(nodes),
        time.perf_counter() - start,
        measured - start,
        time.perf_counter() - measured,
        base_error,
        sum(fp32_ms.values()),
        sum(int8_ms.values()),
        fp32_rest,
        int8_rest,
    )
    return sens


def _harm_key(s: LayerSensitivity) -> tuple[int, float]:
    # A layer that int8 does not speed up has nothing to trade its accuracy cost against: first.
    if s.time_saved_ms <= 0:
        return (0, -s.acc_cost)
    return (1, -s.acc_cost / s.time_saved_ms)


def revert_order(sens: Mapping[str, LayerSensitivity]) -> list[str]:
    """Layers in the order start-up trials should put them back to fp32: most harm per time saved first.

    Layers that int8 does not speed up come first (by accuracy cost), then the others by
    ``acc_cost / time_saved_ms``, highest first.

    Example:
        >>> sens = {
        ...     "a": LayerSensitivity(0.01, 0.01, 1.0, 0.5),   # 0.02 per ms
        ...     "b": LayerSensitivity(0.10, 0.10, 1.0, 0.8),   # 0.5 per ms
        ...     "c": LayerSensitivity(0.00, 0.00, 0.1, 0.2),   # slower in int8
        ... }
        >>> revert_order(sens)
        ['c', 'b', 'a']
    """
    return sorted(sens, key=lambda n: _harm_key(sens[n]))


def choice_scores(sens: Mapping[str, LayerSensitivity]) -> dict[str, dict[str, float]]:
    """A prior over each layer's choice for samplers: ``"layer:<node>" -> {"int8": p, "fp32": 1 - p}``.

    ``p = 0.5 + 0.4 (t - a)``: ``a`` is the layer's accuracy cost over the largest one, ``t`` the
    time it saves over the largest saving (0 when it saves none), so the layer that costs the most
    and saves nothing scores 0.1 for int8 and the one that saves the most at no cost 0.9. The
    scores rank layers against each other; they do not say whether any layer must be fp32.

    Example:
        >>> choice_scores({"a": LayerSensitivity(0.05, 0.05, 1.0, 0.5), "b": LayerSensitivity(0.2, 0.2, 0.1, 0.2)})
        {'layer:a': {'int8': 0.8, 'fp32': 0.2}, 'layer:b': {'int8': 0.1, 'fp32': 0.9}}
    """
    top_cost = max((max(s.acc_cost, 0.0) for s in sens.values()), default=0.0)
    top_saved = max((max(s.time_saved_ms, 0.0) for s in sens.values()), default=0.0)
    scores = {}
    for node, s in sens.items():
        a = max(s.acc_cost, 0.0) / top_cost if top_cost > 0 else 0.0
        t = max(s.time_saved_ms, 0.0) / top_saved if top_saved > 0 else 0.0
        p = round(min(max(0.5 + 0.4 * (t - a), SCORE_RANGE[0]), SCORE_RANGE[1]), 4)
        scores[LAYER_PREFIX + node] = {"int8": p, "fp32": round(1.0 - p, 4)}
    return scores
