"""int8, 7-bit (``reduce_range``) and uint8 weights side by side, on the CPU this runs on.

For each model, the reference configuration with each weight type of the ``weight_type`` scope,
measured in turn by one :class:`~optuna_quant.measure.measurer.Measurer`: ``acc_loss`` always,
``lat_diff`` unless ``--no-timing``. The scope is offered only on the CPU classes whose u8s8
kernels saturate (x86 without VNNI); run it there, or on such a CPU emulated by QEMU (slow: the
accuracy holds, the timing does not), to see whether it pays::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_weight_types --models demo minilm
    OPENBLAS_NUM_THREADS=1 qemu-x86_64 -cpu Haswell-v4 .venv/bin/python -m benchmarks.bench_weight_types --models demo --no-timing

Results go to ``benchmarks/results/weight_types.json``, one entry per model and int8 class.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from collections.abc import Sequence
import dataclasses
import json
import os
from pathlib import Path

from benchmarks._versions import versions
from optuna_quant.measure.cpu import int8_support
from optuna_quant.measure.loss import relative_accuracy_loss
from optuna_quant.measure.measurer import Measurer
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.config import WEIGHT_TYPES


RESULTS = Path(__file__).parent / "results" / "weight_types.json"


def demo() -> tuple[Measurer, QuantConfig]:
    """The demo's MNIST CNN, 200 calibration images, 1,500 test images; static reference."""
    from benchmarks._demo_setup import demo_objective

    return demo_objective().measurer, QuantConfig()


def minilm() -> tuple[Measurer, QuantConfig]:
    """all-MiniLM-L6-v2 from its wheel, scored by embedding agreement; dynamic reference."""
    from examples.bert import EmbeddingAgreement
    from examples.bert import minilm as minilm_path
    from examples.bert import sentence_feeds
    from examples.bert import SENTENCES

    path = minilm_path()
    return Measurer(path, sentence_feeds(SENTENCES[:16]), EmbeddingAgreement(path, sentence_feeds(SENTENCES[16:]))), QuantConfig(
        approach="dynamic"
    )


MODELS: dict[str, Callable[[], tuple[Measurer, QuantConfig]]] = {"demo": demo, "minilm": minilm}


def measure(measurer: Measurer, reference: QuantConfig, timing: bool) -> dict[str, dict[str, float]]:
    """Each weight type of ``reference``, in turn: ``acc_loss``, and ``lat_diff`` with ``timing``."""
    fp32 = measurer.baseline()
    figures: dict[str, dict[str, float]] = {}
    for weight_type in WEIGHT_TYPES:
        config = dataclasses.replace(reference, weight_type=weight_type)
        if timing:
            m = measurer.measure(config)
            figures[weight_type] = {"acc_loss": m.acc_loss, "lat_diff": m.lat_diff, "spread": m.latency.spread}
        else:
            accuracy = measurer.accuracy(config)
            figures[weight_type] = {"acc_loss": relative_accuracy_loss(fp32, accuracy)}
        print(weight_type, " ".join(f"{k} {v:.4f}" for k, v in figures[weight_type].items()), flush=True)
    return figures


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["demo"])
    parser.add_argument("--no-timing", action="store_true", help="accuracy only (under an emulator)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cpu = int8_support()
    print(cpu.describe(), flush=True)
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    for name in args.models:
        print(f"== {name}", flush=True)
        measurer, reference = MODELS[name]()
        results[f"{name}@{cpu.int8_class}"] = {
            "int8_class": cpu.int8_class,
            "timing": not args.no_timing,
            "weight_types": measure(measurer, reference, timing=not args.no_timing),
            "versions": versions(),
        }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
