"""Latency repeatability: the same configuration measured again and again.

Each repeat builds a fresh int8 session and runs the paired, interleaved measurement of
:func:`optuna_quant.latency.measure_latency` with the default :class:`BenchmarkSettings`. The figure
of merit is the coefficient of variation of ``lat_diff`` over the repeats; the absolute times are
shown as context only (they drift with the machine's load, the ratio should not).

Run::

    python -m benchmarks.bench_latency [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import statistics

from benchmarks._demo_setup import demo_objective


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    objective = demo_objective()
    params = objective.space.default_params()
    results = [objective.measure(params).latency for _ in range(args.repeats)]
    lat = [r.lat_diff for r in results]
    for i, r in enumerate(results):
        print(f"repeat {i}: lat_diff {r.lat_diff:.4f}  spread {r.spread:.3f}  fp32 {r.fp32_ms:.3f} ms  int8 {r.int8_ms:.3f} ms")
    fp32 = [r.fp32_ms for r in results]
    summary = {
        "repeats": args.repeats,
        "lat_diff_median": statistics.median(lat),
        "lat_diff_cv": statistics.stdev(lat) / statistics.mean(lat),
        "fp32_ms_cv": statistics.stdev(fp32) / statistics.mean(fp32),
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
