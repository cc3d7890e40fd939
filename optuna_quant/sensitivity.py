"""Per-layer sensitivity: what int8 costs each searchable layer in accuracy, and what it saves in time.

Measured once per study, before the search:

- **Accuracy.** The error of the final outputs against the fp32 model on calibration data, as a
  noise-to-signal ratio ``||y_int8 - y_fp32||^2 / ||y_fp32||^2`` summed over the outputs
  (:func:`output_error`). Quantization noise of independent layers adds up in that ratio, so the
  per-layer figures add up to predict a configuration. Two figures per layer: the error when only
  that layer is int8 (``error_alone``), and how much error keeping only that layer in fp32
  removes from the all-int8 model (``error_recovered``). :attr:`LayerSensitivity.acc_cost` is the
  one that predicted the measured accuracy loss of configurations better (see docs).
- **Time.** What reverting the layer alone to fp32 costs the all-int8 model, end to end: a short
  paired timing (:func:`optuna_quant.latency.measure_latency`) of the all-int8 model against the
  model with that layer in fp32 (:attr:`LayerSensitivity.revert_cost`), and from the other end,
  of the fp32 model against the model with only that layer in int8
  (:attr:`LayerSensitivity.alone_speedup`). A revert adds
  DequantizeLinear, QuantizeLinear and layout reorders around the layer, which no per-node
  profile charges to it; on the benchmark models they are most of its cost. Next to it,
  onnxruntime's profiler (``SessionOptions.enable_profiling``) on the fp32 and the all-int8
  model: the median time of each node of the optimized graph, mapped back to the layer it came
  from (:func:`layer_of`). onnxruntime fuses ``DequantizeLinear -> Conv -> QuantizeLinear``
  into ``QLinearConv`` (named ``<layer>_token_<n>``) and fp32 ``Conv -> Relu`` into an NCHWc
  ``Conv`` named after the Relu's output, so a node is charged to a layer by its name
  (``<layer>`` or ``<layer>_...``) or else by a weight or bias of the layer among its inputs
  (``<initializer>`` or ``<initializer>_...``), trying every quantizable node of the model,
  longest names first (``node_conv2d_1_token_5`` is ``node_conv2d_1``'s, not ``node_conv2d``'s). A node with a single data input that neither maps
  (the int8 model's Relu and QuantizeLinear after a layer, a layout reorder) is charged to the
  layer of that input's producer, since the fp32 model fuses the Relu into the layer. What stays
  unattributed (the graph input's QuantizeLinear, nodes with several data inputs such as Add or
  Concat, and what they feed) is reported by the log line as the models' unattributed node time.

The other parameters move the all-int8 error by far more than the layers differ, so the layers are
measured where quantizing loses least: :func:`measure_scope_errors` gives the all-int8 output
error of every combination of the other parameters (no timing: cheap), and the layers are
measured at the lowest. :func:`choice_scores` turns both into a prior for samplers (parameter ->
choice -> score), and :func:`revert_order` into the order in which start-up trials put layers back
to fp32.

Example:
    >>> combos = scope_combinations(space.distributions())                   # doctest: +SKIP
    >>> errors = measure_scope_errors(model, quantizer, feeds, combos,       # doctest: +SKIP
    ...     lambda p: space.to_config({**space.default_params(), **p}))
    >>> best = lowest_error(errors)["params"]                                 # doctest: +SKIP
    >>> sens = measure_sensitivity(model, quantizer, feeds, space.nodes,      # doctest: +SKIP
    ...     base_config=space.to_config({**space.default_params(), **best}))
    >>> revert_order(sens)[:2]                                               # doctest: +SKIP
    ['/6/Conv', '/0/Conv']
    >>> choice_scores(sens, acc_loss=0.03, accuracy_target=0.01, scope_errors=errors)["layer:/6/Conv"]  # doctest: +SKIP
    {'fp32': 0.93, 'int8': 0.07}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
import itertools
import json
import logging
from pathlib import Path
import tempfile
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from optuna.distributions import CategoricalDistribution

from optuna_quant.latency import BenchmarkSettings
from optuna_quant.latency import measure_latency
from optuna_quant.model_io import Feed
from optuna_quant.quantize import Quantizer
from optuna_quant.space import LAYER_PREFIX
from optuna_quant.space import QuantConfig
from optuna_quant.space import quantizable_nodes
from optuna_quant.space import SearchSpace

_logger = logging.getLogger(__name__)

PROFILE_SUFFIX = "_kernel_time"
SCORE_RANGE = (0.1, 0.9)
"""The lowest and highest score of a choice of the other parameters: a prior, never a verdict."""
LAYER_SCORE_RANGE = (0.05, 0.95)
"""The lowest and highest score of a layer's choice."""
MATERIAL_BENEFIT = 0.05
"""What a revert must buy (accuracy in targets, or speed as a share of the speed-up) to matter:
one that buys half this has a third of the odds its gain and cost alone would give."""
REVERT_TIMING = BenchmarkSettings(threads=1, warmup=5, blocks=6, min_seconds=0.3)
"""The short paired timing of each revert (about 0.3 s of runs per layer, plus its session)."""

ScopeError = dict[str, Any]
"""``{"params": {name: choice}, "error": float}``: the all-int8 output error of one combination."""


@dataclass(frozen=True)
class LayerSensitivity:
    """How much one layer's int8 costs and saves.

    Attributes:
        error_alone: Output noise-to-signal ratio when only this layer of the searched ones is int8.
        error_recovered: Output noise-to-signal ratio that keeping only this layer in fp32 removes
            from the all-int8 model (negative when it adds some).
        fp32_ms: This layer's profiled node time in the fp32 model, per run, in milliseconds.
        int8_ms: This layer's profiled node time in the all-int8 model (its int8 kernel and the
            Q/DQ named after it), per run, in milliseconds.
        revert_cost: The share of the all-int8 model's speed-up that keeping only this layer in
            fp32 loses, timed end to end: ``1 - t_all_int8 / t_reverted`` (negative when the
            revert is faster); ``None`` when not measured (a measurement stored before it was).
        alone_speedup: The speed-up of the model with only this layer of the searched ones in
            int8 over the fp32 model, timed end to end: ``t_fp32 / t_alone`` (above 1 when this
            layer's int8 pays on its own); ``None`` when not measured. It and ``revert_cost``
            can disagree: reverting one layer of an all-int8 model adds the Q/DQ around it,
            quantizing one layer of an fp32 model adds them too: on mtcnn_onet the first two
            convolutions cost much when reverted alone, every convolution slows the fp32 model
            or ties it when quantized alone, and the fastest configuration keeps all four in fp32.
    """

    error_alone: float
    error_recovered: float
    fp32_ms: float
    int8_ms: float
    revert_cost: float | None = None
    alone_speedup: float | None = None

    @property
    def acc_cost(self) -> float:
        """What int8 costs this layer in accuracy: :attr:`error_alone` (the better predictor)."""
        return self.error_alone

    @property
    def time_saved_ms(self) -> float:
        """Profiled time int8 saves on this layer per run (negative when it is slower than fp32)."""
        return self.fp32_ms - self.int8_ms

    def to_dict(self) -> dict[str, float | None]:
        """The measurement as a JSON-serialisable dict (a study user attr)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerSensitivity:
        """The measurement stored by :meth:`to_dict` (``revert_cost`` and ``alone_speedup`` may
        be absent).

        Example:
            >>> LayerSensitivity.from_dict({"error_alone": 0.1, "error_recovered": 0.1, "fp32_ms": 1, "int8_ms": 0.5})
            LayerSensitivity(error_alone=0.1, error_recovered=0.1, fp32_ms=1.0, int8_ms=0.5, revert_cost=None, alone_speedup=None)
        """
        optional = {key: None if data.get(key) is None else float(data[key]) for key in ("revert_cost", "alone_speedup")}
        return cls(**{key: float(data[key]) for key in ("error_alone", "error_recovered", "fp32_ms", "int8_ms")}, **optional)


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

    Names are tried longest first, so that a layer whose name extends another's
    (``node_conv2d_1`` and ``node_conv2d``) gets its own nodes.

    Args:
        node: A node of the optimized graph.
        layers: For each layer (every quantizable node of the model, so that none is charged
            to another), the names of its initializers (weight, bias).

    Example:
        >>> from onnx import helper
        >>> layers = {"conv": ["w"], "conv_1": ["w_1"], "/2/Conv": ["2.weight"]}
        >>> fused = helper.make_node("QLinearConv", ["x", "s", "z", "w_1_quantized"], ["y"], name="conv_1_token_5")
        >>> layer_of(fused, layers)
        'conv_1'
        >>> layer_of(helper.make_node("Conv", ["x", "w_1_reorder"], ["y"], name="/1/Relu_output_0_nchwc"), layers)
        'conv_1'
        >>> layer_of(helper.make_node("Relu", ["x"], ["y"], name="/1/Relu"), layers) is None
        True
    """
    for layer in sorted(layers, key=len, reverse=True):
        if node.name == layer or node.name.startswith(layer + "_"):
            return layer
    matches = [
        (len(init), layer)
        for layer, initializers in layers.items()
        for init in initializers
        for name in node.input
        if name == init or name.startswith(init + "_")
    ]
    return max(matches)[1] if matches else None


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


def _session(model: onnx.ModelProto, settings: BenchmarkSettings) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), settings.session_options(), providers=["CPUExecutionProvider"])


def _outputs(model: onnx.ModelProto, samples: Sequence[Feed], settings: BenchmarkSettings) -> list[list[np.ndarray]]:
    session = _session(model, settings)
    return [session.run(None, feed) for feed in samples]


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


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
    revert_timing: BenchmarkSettings | None = REVERT_TIMING,
    timing_feed: Feed | None = None,
) -> dict[str, LayerSensitivity]:
    """Measure every layer of ``nodes`` once: its accuracy cost and what int8 saves on it.

    Costs ``2 n + 2`` quantized models' output errors on ``n_samples`` feeds, two profiles, and
    ``2 n`` short paired timings (``revert_timing``: about 0.3 s of runs and one session each by
    default; the log line gives their time).

    Args:
        fp32_model: The fp32 model that ``quantizer`` quantizes.
        quantizer: Builds the int8 models (cached calibration).
        feeds: Input dicts; the first ``n_samples`` measure the output error.
        nodes: The searchable layers; the others keep ``base_config``'s choice throughout.
        base_config: The all-int8 configuration (default :class:`QuantConfig`; best measured at
            the lowest-error combination of :func:`measure_scope_errors`).
        n_samples: Feeds on which the output error is measured.
        profile_runs: Profiled runs of each of the fp32 and the all-int8 models.
        settings: Threads for every session (default :class:`BenchmarkSettings`).
        revert_timing: The paired timing of each revert (:attr:`LayerSensitivity.revert_cost`)
            and of each layer alone in int8 (:attr:`LayerSensitivity.alone_speedup`), on
            ``settings``' threads; ``None`` leaves both unmeasured.
        timing_feed: The input that is profiled and timed (default: the first feed). Give the
            one the study times its trials on: what a layer's int8 saves depends on the input's
            size (silero-vad's output layer: its revert reads 0 % to +0.6 % on a calibration
            feed of 187 rows, and -4 % to -6 %, a revert that speeds the model up, on the one row
            its study times; ``benchmarks/real_models/layer_timing.py``).

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
    _check_positive(n_samples=n_samples, profile_runs=profile_runs)
    samples = list(feeds[:n_samples])
    timed = samples[0] if timing_feed is None else timing_feed
    _logger.info(
        "Measuring the sensitivity of %d layers on %d samples, timed on a batch of %d",
        len(nodes),
        len(samples),
        len(next(iter(timed.values()))),
    )
    start = time.perf_counter()

    def with_fallback(fallback: Iterable[str]) -> onnx.ModelProto:
        return quantizer.quantize(replace(base, fallback=frozenset(base.fallback | set(fallback))))

    reference = _outputs(fp32_model, samples, settings)
    all_int8 = quantizer.quantize(base)
    base_error = output_error(reference, _outputs(all_int8, samples, settings))
    profiling = time.perf_counter()
    layers = _initializers_of(fp32_model, sorted(set(quantizable_nodes(fp32_model)) | set(nodes)))
    fp32_ms, fp32_rest = profile_layers(fp32_model, timed, layers, settings, profile_runs)
    int8_ms, int8_rest = profile_layers(all_int8, timed, layers, settings, profile_runs)
    profiled = time.perf_counter()
    timing = None if revert_timing is None else replace(revert_timing, threads=settings.threads)
    fp32_timed = int8_timed = None
    if timing is not None:
        fp32_timed, int8_timed = _session(fp32_model, timing), _session(all_int8, timing)
    timed_seconds = 0.0

    def speedup_over(first: ort.InferenceSession | None, model: onnx.ModelProto) -> float | None:
        """``t_first / t_model``, timed in pairs; ``None`` without ``revert_timing``."""
        nonlocal timed_seconds
        if first is None or timing is None:
            return None
        begin = time.perf_counter()
        ratio = measure_latency(first, _session(model, timing), timed, timing).lat_diff
        timed_seconds += time.perf_counter() - begin
        return ratio

    sens: dict[str, LayerSensitivity] = {}
    # One layer's two models at a time, dropped once measured: holding all 2 n of them raised a
    # PP-OCRv4 study's peak (51 layers) to 2.3 GB, against 0.95 GB like this.
    for n in nodes:
        only, reverted = with_fallback(set(nodes) - {n}), with_fallback({n})
        # The all-int8 model in measure_latency's "fp32" slot: t_all / t_reverted.
        kept = speedup_over(int8_timed, reverted)
        sens[n] = LayerSensitivity(
            error_alone=output_error(reference, _outputs(only, samples, settings)),
            error_recovered=base_error - output_error(reference, _outputs(reverted, samples, settings)),
            fp32_ms=fp32_ms[n],
            int8_ms=int8_ms[n],
            revert_cost=None if kept is None else 1.0 - kept,
            alone_speedup=speedup_over(fp32_timed, only),
        )
    total = time.perf_counter() - start
    _logger.info(
        "Measured the sensitivity of %d layers in %.1f s (output errors %.1f s, profiles %.1f s, timings "
        "of each revert and each layer alone %.1f s): all-int8 error %.3g; layer node time fp32 %.3f ms, "
        "int8 %.3f ms; unattributed %.3f ms and %.3f ms",
        len(nodes),
        total,
        total - (profiled - profiling) - timed_seconds,
        profiled - profiling,
        timed_seconds,
        base_error,
        sum(fp32_ms[n] for n in nodes),
        sum(int8_ms[n] for n in nodes),
        fp32_rest,
        int8_rest,
    )
    return sens


def scope_combinations(distributions: Mapping[str, CategoricalDistribution]) -> list[dict[str, Any]]:
    """Every combination of the choices of the parameters other than layers, the first choices first.

    Example:
        >>> from optuna.distributions import CategoricalDistribution as C
        >>> scope_combinations({"layer:a": C(["int8", "fp32"]), "granularity": C(["per_channel", "per_tensor"])})
        [{'granularity': 'per_channel'}, {'granularity': 'per_tensor'}]
    """
    names = [name for name in distributions if not name.startswith(LAYER_PREFIX)]
    product = itertools.product(*(distributions[name].choices for name in names))
    return [dict(zip(names, values)) for values in product]


def measure_scope_errors(
    fp32_model: onnx.ModelProto,
    quantizer: Quantizer,
    feeds: Sequence[Feed],
    combinations: Sequence[Mapping[str, Any]],
    to_config: Callable[[Mapping[str, Any]], QuantConfig],
    *,
    n_samples: int = 32,
    settings: BenchmarkSettings | None = None,
) -> list[ScopeError]:
    """The all-int8 output error (:func:`output_error`) of each combination of the other parameters.

    No timing: one quantized model and ``n_samples`` runs per combination (calibration is
    ``quantizer``'s, once per range estimator).

    Args:
        fp32_model: The fp32 model that ``quantizer`` quantizes.
        quantizer: Builds the int8 models.
        feeds: Input dicts; the first ``n_samples`` count.
        combinations: The combinations (:func:`scope_combinations`), the reference's first.
        to_config: The all-int8 configuration of a combination.
        n_samples: Feeds on which the output error is measured.
        settings: Threads for every session (default :class:`BenchmarkSettings`).

    Returns:
        ``{"params": combination, "error": float}`` per combination, in their order.

    Raises:
        ValueError: If ``combinations`` is empty or ``n_samples`` is not positive.
    """
    if not combinations:
        raise ValueError("combinations must hold at least the reference's.")
    _check_positive(n_samples=n_samples)
    settings = settings or BenchmarkSettings()
    samples = list(feeds[:n_samples])
    start = time.perf_counter()
    reference = _outputs(fp32_model, samples, settings)
    errors = [
        {"params": dict(params), "error": output_error(reference, _outputs(quantizer.quantize(to_config(params)), samples, settings))}
        for params in combinations
    ]
    best = lowest_error(errors)
    _logger.info(
        "Measured the all-int8 output error of %d combinations in %.1f s: reference %.3g, lowest %.3g at %s",
        len(errors),
        time.perf_counter() - start,
        errors[0]["error"],
        best["error"],
        best["params"],
    )
    return errors


def lowest_error(scope_errors: Sequence[ScopeError]) -> ScopeError:
    """The combination with the lowest all-int8 output error: where to measure the layers."""
    return min(scope_errors, key=lambda entry: entry["error"])


def measure_space(
    fp32_model: onnx.ModelProto,
    quantizer: Quantizer,
    feeds: Sequence[Feed],
    space: SearchSpace,
    *,
    n_samples: int = 32,
    profile_runs: int = 20,
    settings: BenchmarkSettings | None = None,
    revert_timing: BenchmarkSettings | None = REVERT_TIMING,
    timing_feed: Feed | None = None,
) -> tuple[list[ScopeError], dict[str, LayerSensitivity]]:
    """What a study measures once: :func:`measure_scope_errors` over ``space``'s other parameters,
    then :func:`measure_sensitivity` of ``space.nodes`` at the lowest-error combination.

    The scope errors cost one quantized model per combination (120 for every scope on a model
    with three ``op_types`` choices; 3 s on the tests' tiny CNN), the layers what
    :func:`measure_sensitivity` says, which ``timing_feed`` is passed to.

    Returns:
        The scope errors (the reference's first) and the layers' sensitivity, the two measurements
        :func:`choice_scores` takes.

    Example:
        >>> errors, sens = measure_space(model, quantizer, feeds, space)  # doctest: +SKIP
        >>> prior = choice_scores(sens, acc_loss=0.03, accuracy_target=0.01, scope_errors=errors)  # doctest: +SKIP
    """

    def to_config(params: Mapping[str, Any]) -> QuantConfig:
        return space.to_config({**space.default_params(), **params})

    combinations = scope_combinations(space.distributions())
    errors = measure_scope_errors(fp32_model, quantizer, feeds, combinations, to_config, n_samples=n_samples, settings=settings)
    if "layer" not in space.scopes:
        return errors, {}  # no layer is searched: their sensitivity would guide nothing
    sens = measure_sensitivity(
        fp32_model,
        quantizer,
        feeds,
        space.nodes,
        base_config=to_config(lowest_error(errors)["params"]),
        n_samples=n_samples,
        profile_runs=profile_runs,
        settings=settings,
        revert_timing=revert_timing,
        timing_feed=timing_feed,
    )
    return errors, sens


def _saving(s: LayerSensitivity) -> float:
    return s.time_saved_ms if s.revert_cost is None else s.revert_cost


def _harm_key(s: LayerSensitivity) -> tuple[int, float]:
    # A layer that int8 does not speed up has nothing to trade its accuracy cost against: first.
    saving = _saving(s)
    if saving <= 0:
        return (0, -s.acc_cost)
    return (1, -s.acc_cost / saving)


def revert_order(sens: Mapping[str, LayerSensitivity]) -> list[str]:
    """Layers in the order start-up trials should put them back to fp32: most harm per time saved first.

    The time a layer's int8 saves is its :attr:`~LayerSensitivity.revert_cost` where measured,
    else its profiled :attr:`~LayerSensitivity.time_saved_ms`. Layers that int8 does not speed
    up come first (by accuracy cost), then the others by ``acc_cost / saving``, highest first.

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


def layer_scores(gain: float, cost: float) -> dict[str, float]:
    """Scores of ``fp32`` and ``int8`` for a layer whose revert to fp32 buys ``gain`` and costs ``cost``.

    ``gain``: the accuracy loss it saves, in accuracy targets; ``cost``: the share of the
    speed-up it loses (negative when the revert is faster). The odds of fp32 are
    ``exp(4 (gain - cost))``, discounted by ``benefit / (benefit + MATERIAL_BENEFIT)`` where
    ``benefit`` is what the revert buys (``gain``, plus the speed when it is faster); fp32 scores
    those odds as a probability within :data:`LAYER_SCORE_RANGE`, int8 the rest. Reverting is
    likely good when it buys more accuracy than it costs speed, and unlikely when it buys nothing:
    on a model of many layers, each of which costs little speed, the layers that do not matter
    stay int8 instead of being drawn half the time.

    Example:
        >>> layer_scores(0.5, 0.25)
        {'fp32': 0.7119, 'int8': 0.2881}
        >>> layer_scores(0.0, 0.02)   # buys nothing: int8
        {'fp32': 0.05, 'int8': 0.95}
    """
    benefit = max(gain, 0.0) + max(-cost, 0.0)
    odds = np.exp(4.0 * (gain - cost)) * benefit / (benefit + MATERIAL_BENEFIT)
    fp32 = float(np.clip(odds / (1.0 + odds), *LAYER_SCORE_RANGE))
    return {"fp32": round(fp32, 4), "int8": round(1.0 - fp32, 4)}


def scope_scores(
    scope_errors: Sequence[ScopeError], *, acc_loss: float | None = None, accuracy_target: float | None = None
) -> dict[str, dict[Any, float]]:
    """Scores of the choices of the other parameters, from the lowest all-int8 error of any
    combination with each choice, within :data:`SCORE_RANGE`.

    A choice scores ``lowest error / its error``: the choices that quantize with the least error
    lead; one ten times worse is unlikely. When the reference (the first entry) meets the
    ``accuracy_target`` with its ``acc_loss`` (fractions), a choice scores ``target / its predicted
    loss`` instead, the loss predicted as ``acc_loss`` times its error over the reference's, and
    the highest where that meets the target: error then matters only where it would miss the
    target, and the choices are left to the speed (on a model whose all-int8 loss is negative,
    every choice ties). Where the reference misses the target the lowest error leads: predicted
    that way, the sampler tables' few feasible choices tied with many infeasible ones
    (docs/benchmarks.md).

    Example:
        >>> errors = [{"params": {"g": "c"}, "error": 0.01}, {"params": {"g": "t"}, "error": 0.04}]
        >>> scope_scores(errors)
        {'g': {'c': 0.9, 't': 0.25}}
        >>> scope_scores(errors, acc_loss=0.002, accuracy_target=0.01)  # t's 0.008: within it too
        {'g': {'c': 0.9, 't': 0.9}}
        >>> scope_scores(errors, acc_loss=0.004, accuracy_target=0.01)  # t's 0.016 misses it
        {'g': {'c': 0.9, 't': 0.625}}
    """
    best: dict[str, dict[Any, float]] = {}
    for entry in scope_errors:
        for name, choice in entry["params"].items():
            by_choice = best.setdefault(name, {})
            by_choice[choice] = min(by_choice.get(choice, np.inf), entry["error"])
    lowest = lowest_error(scope_errors)["error"]
    reference = scope_errors[0]["error"]

    def score(error: float) -> float:
        if acc_loss is None or accuracy_target is None or acc_loss > accuracy_target or reference <= 0:
            return lowest / error if error > 0 else 1.0
        predicted = max(acc_loss, 0.0) * error / reference
        return accuracy_target / predicted if predicted > accuracy_target else 1.0

    return {
        name: {choice: round(float(np.clip(score(error), *SCORE_RANGE)), 4) for choice, error in by_choice.items()}
        for name, by_choice in best.items()
    }


def choice_scores(
    sens: Mapping[str, LayerSensitivity],
    *,
    acc_loss: float,
    accuracy_target: float,
    scope_errors: Sequence[ScopeError] = (),
) -> dict[str, dict[Any, float]]:
    """A prior for samplers, ``{parameter: {choice: score in (0, 1)}}``, from the measurements.

    - The other parameters (those of ``scope_errors``, named as there): :func:`scope_scores`
      with ``acc_loss`` and ``accuracy_target``.
    - Each layer (``"layer:<node>"``): :func:`layer_scores` of what reverting it buys and costs.
      The all-int8 configuration's accuracy loss is shared out over the layers as their output
      error is: reverting a layer buys ``acc_loss * error_recovered / sum(error_alone)`` (the
      summed ``error_alone`` standing for the all-int8 error, as the errors add up), in units of
      ``accuracy_target`` (nothing when that loss, or the error it recovers, is negative); it
      costs its measured :attr:`~LayerSensitivity.revert_cost`.

    Args:
        sens: The layers' sensitivity, with ``revert_cost`` measured, at the lowest-error
            combination of ``scope_errors`` (or at the reference when there are none).
        acc_loss: The reference's relative accuracy loss (a fraction: 0.02 for 2 %). With
            ``scope_errors``, the loss at the lowest-error combination is predicted from it,
            scaled by the ratio of the two errors (the first entry is the reference's).
        accuracy_target: The largest acceptable relative accuracy loss, as a fraction.
        scope_errors: :func:`measure_scope_errors`' result; none: layers only.

    Raises:
        ValueError: If ``accuracy_target`` is not positive or a layer has no ``revert_cost``.

    Example:
        >>> sens = {"a": LayerSensitivity(0.03, 0.03, 0.1, 0.05, 0.05), "b": LayerSensitivity(0.01, 0.0, 0.1, 0.05, 0.3)}
        >>> choice_scores(sens, acc_loss=0.02, accuracy_target=0.01)
        {'layer:a': {'fp32': 0.95, 'int8': 0.05}, 'layer:b': {'fp32': 0.05, 'int8': 0.95}}
    """
    if not accuracy_target > 0:
        raise ValueError(f"accuracy_target must be a positive fraction, got {accuracy_target!r}.")
    unmeasured = [node for node, s in sens.items() if s.revert_cost is None]
    if unmeasured:
        raise ValueError(f"Layers {unmeasured} have no revert_cost; measure them with revert_timing set.")
    scores: dict[str, dict[Any, float]] = {}
    if scope_errors:
        scores.update(scope_scores(scope_errors, acc_loss=acc_loss, accuracy_target=accuracy_target))
        reference = scope_errors[0]["error"]
        acc_loss = acc_loss * lowest_error(scope_errors)["error"] / reference if reference > 0 else acc_loss
    # A configuration that loses nothing leaves no accuracy to buy back; a revert that adds
    # output error (noise) buys none either.
    acc_loss = max(acc_loss, 0.0)
    total = sum(max(s.error_alone, 0.0) for s in sens.values())
    for node, s in sens.items():
        gain = acc_loss * max(s.error_recovered, 0.0) / total / accuracy_target if total > 0 else 0.0
        scores[LAYER_PREFIX + node] = layer_scores(gain, s.revert_cost)  # type: ignore[arg-type]
    return scores
