"""A synthetic quantization table with a known optimum and planted interactions.

The space has the shape of a real one: six ``layer:`` fallbacks, the five-way ``range_estimator``,
``granularity`` and ``mode``; 1,280 configurations. Accuracy and latency come from a small additive
model with two planted interactions, so that a sampler that models interactions can be told from
one that does not:

- ``layer:node_conv2d_2`` and ``layer:node_conv2d_3`` carry a joint error (a residual pair whose
  quantization noise cancels only when both branches are fp32): either one in fp32 alone costs
  latency and recovers nothing, so each looks bad on its own.
- Calibration matters only for ``per_tensor`` weights; ``per_channel`` absorbs the outliers but is
  slower, and the latency target needs ``per_tensor``'s extra speed-up to be met with margin.

By POT's best-result rule the optimum is unique: conv2d_2 and conv2d_3 in fp32, ``per_tensor``,
``symmetric`` (the highest ``lat_diff`` within the accuracy target), and ``percentile_99.99`` (the
lowest ``acc_loss`` of the four calibrations that tie on it). Run
``.venv/bin/python -m benchmarks.synthetic`` to rewrite ``benchmarks/tables/synthetic_interactions.json``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from benchmarks.table import configurations
from benchmarks.table import Table
from benchmarks.table import TABLES_DIR


LAYERS = [f"layer:node_conv2d{suffix}" for suffix in ("", "_1", "_2", "_3", "_4", "_5")]
PAIR = ("layer:node_conv2d_2", "layer:node_conv2d_3")
# fp32 milliseconds of each layer, and of the unquantized rest of the graph.
LAYER_MS = dict(zip(LAYERS, (2.0, 3.0, 0.8, 0.8, 3.0, 2.0)))
REST_MS = 0.5
INT8_SPEEDUP = {"per_channel": 3.0, "per_tensor": 3.3}
ASYMMETRIC_SLOWDOWN = 1.05
# Relative accuracy loss of each layer kept in int8, outside the planted pair.
LAYER_ERROR = dict(zip(LAYERS, (0.001, 0.0005, 0.001, 0.001, 0.0005, 0.003)))
PAIR_ERROR = 0.008
PER_TENSOR_CALIBRATION_ERROR = {
    "minmax": 0.006,
    "entropy": 0.003,
    "percentile_99.9": 0.004,
    "percentile_99.99": 0.0005,
    "percentile_99.999": 0.002,
}
PER_CHANNEL_CALIBRATION_ERROR = 0.001
ASYMMETRIC_GAIN = 0.001
FP32_ACCURACY = 0.98

PARAMS: dict[str, list[Any]] = {
    **{layer: ["int8", "fp32"] for layer in LAYERS},
    "range_estimator": list(PER_TENSOR_CALIBRATION_ERROR),
    "granularity": ["per_channel", "per_tensor"],
    "mode": ["symmetric", "asymmetric"],
}
TARGETS = {"accuracy_loss": 1.0, "latency_reduce": 2.2}


def latency_ms(config: dict[str, Any]) -> float:
    """Modelled batch-1 latency of a configuration."""
    speedup = INT8_SPEEDUP[config["granularity"]]
    slowdown = ASYMMETRIC_SLOWDOWN if config["mode"] == "asymmetric" else 1.0
    int8_ms = sum(ms for layer, ms in LAYER_MS.items() if config[layer] == "int8")
    fp32_ms = sum(ms for layer, ms in LAYER_MS.items() if config[layer] == "fp32")
    return int8_ms / speedup * slowdown + fp32_ms + REST_MS


def acc_loss(config: dict[str, Any]) -> float:
    """Modelled relative accuracy loss of a configuration."""
    loss = sum(err for layer, err in LAYER_ERROR.items() if config[layer] == "int8")
    if any(config[layer] == "int8" for layer in PAIR):
        loss += PAIR_ERROR
    if config["granularity"] == "per_tensor":
        loss += PER_TENSOR_CALIBRATION_ERROR[config["range_estimator"]]
    else:
        loss += PER_CHANNEL_CALIBRATION_ERROR
    if config["mode"] == "asymmetric":
        loss -= ASYMMETRIC_GAIN
    return round(loss, 6)


def synthetic_table() -> Table:
    """The synthetic table, every configuration of :data:`PARAMS`."""
    fp32_ms = sum(LAYER_MS.values()) + REST_MS
    rows = []
    for config in configurations(PARAMS):
        loss = acc_loss(config)
        rows.append(
            {
                "params": config,
                "accuracy": round(FP32_ACCURACY * (1 - loss), 6),
                "acc_loss": loss,
                "lat_diff": round(fp32_ms / latency_ms(config), 6),
            }
        )
    return Table(
        name="synthetic_interactions",
        description=(
            "Synthetic space of a real shape (6 binary layer fallbacks, 5 range estimators, "
            "granularity, mode) from an additive model with two planted interactions: "
            "layer:node_conv2d_2 and layer:node_conv2d_3 recover accuracy only when both are fp32, "
            "and calibration matters only for per_tensor weights, which the latency target needs. "
            "Optimum by POT's best-result rule: conv2d_2 and conv2d_3 fp32, per_tensor, symmetric, "
            "percentile_99.99 (the other calibrations tie on lat_diff with a higher acc_loss). "
            "Made by: .venv/bin/python -m benchmarks.synthetic"
        ),
        params=PARAMS,
        targets=TARGETS,
        fp32={"accuracy": FP32_ACCURACY, "latency_ms": fp32_ms},
        rows=rows,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (none; ``--help`` says what the command does)."""
    return argparse.ArgumentParser(description=f"Rewrite {TABLES_DIR.name}/synthetic_interactions.json.").parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Write the synthetic table and print its shape."""
    parse_args(argv)
    table = synthetic_table()
    TABLES_DIR.mkdir(parents=True, exist_ok=True)
    table.save(TABLES_DIR / f"{table.name}.json")
    print(
        f"{table.name}: {table.size} configurations, {table.feasible_fraction:.2%} meet both targets, "
        f"best lat_diff within accuracy {table.best_lat_diff:.4f}"
    )


if __name__ == "__main__":
    main()
