"""The sampler benchmark's metrics, on a hand-made table and on the synthetic one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
import sys

import numpy as np
import optuna
import pytest


# benchmarks/ is a folder of the checkout, not of the installed package: make it importable
# however pytest is started.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_samplers import BASELINES  # noqa: E402
from benchmarks.bench_samplers import best_feasible_lat_diff  # noqa: E402
from benchmarks.bench_samplers import checkpoints  # noqa: E402
from benchmarks.bench_samplers import count_duplicates  # noqa: E402
from benchmarks.bench_samplers import HYPEROPT_TPE  # noqa: E402
from benchmarks.bench_samplers import main  # noqa: E402
from benchmarks.bench_samplers import median_missing_worst  # noqa: E402
from benchmarks.bench_samplers import PEERS  # noqa: E402
from benchmarks.bench_samplers import resolve  # noqa: E402
from benchmarks.bench_samplers import run_optuna  # noqa: E402
from benchmarks.bench_samplers import run_task  # noqa: E402
from benchmarks.bench_samplers import sensitivity_prior  # noqa: E402
from benchmarks.bench_samplers import smallest_choice_count  # noqa: E402
from benchmarks.bench_samplers import standin_prior  # noqa: E402
from benchmarks.bench_samplers import summarise  # noqa: E402
from benchmarks.bench_samplers import table_distributions  # noqa: E402
from benchmarks.bench_samplers import table_guidance  # noqa: E402
from benchmarks.bench_samplers import Task  # noqa: E402
from benchmarks.bench_samplers import Trace  # noqa: E402
from benchmarks.bench_samplers import trials_to_target  # noqa: E402
from benchmarks.build_tables import Setup  # noqa: E402
from benchmarks.build_tables import with_quantized  # noqa: E402
from benchmarks.synthetic import synthetic_table  # noqa: E402
from benchmarks.table import configurations  # noqa: E402
from benchmarks.table import Table  # noqa: E402
from benchmarks.table import TABLES_DIR  # noqa: E402
from optuna_quant.measure.sensitivity import LayerSensitivity  # noqa: E402
from optuna_quant.quantization.config import QuantConfig  # noqa: E402
from optuna_quant.trial.scoring import choice_scores  # noqa: E402
from optuna_quant.trial.scoring import LAYER_SCORE_RANGE  # noqa: E402
from optuna_quant.trial.scoring import layer_scores  # noqa: E402
from optuna_quant.trial.scoring import REVERT_RESOLUTION  # noqa: E402
from optuna_quant.trial.scoring import unresolved_saving  # noqa: E402


# acc_loss, lat_diff of each configuration of a 2 x 3 space; targets 1 % and 1.5.
TINY_RESULTS = {
    ("x", "u"): (0.02, 2.0),  # the default: fast, too lossy
    ("x", "v"): (0.005, 1.2),  # accurate, too slow
    ("x", "w"): (0.005, 1.6),  # meets both
    ("y", "u"): (0.03, 1.0),
    ("y", "v"): (0.0, 1.0),
    ("y", "w"): (0.009, 1.8),  # meets both, the optimum
}


@pytest.fixture
def tiny() -> Table:
    params = {"a": ["x", "y"], "b": ["u", "v", "w"]}
    rows = []
    for config in configurations(params):
        acc_loss, lat_diff = TINY_RESULTS[(config["a"], config["b"])]
        rows.append({"params": config, "accuracy": 1 - acc_loss, "acc_loss": acc_loss, "lat_diff": lat_diff})
    return Table.from_rows(
        name="tiny",
        description="hand-made",
        params=params,
        targets={"accuracy_loss": 1.0, "latency_reduce": 1.5},
        fp32={"accuracy": 1.0, "latency_ms": 1.0},
        rows=rows,
    )


def trace_of(table: Table, configs: list[tuple[str, str]]) -> Trace:
    trace = Trace()
    for a, b in configs:
        row = table.lookup({"a": a, "b": b})
        trace.keys.append((a, b))
        trace.loss.append(table.loss(row["params"]))
    return trace


def test_table_shape(tiny: Table) -> None:
    assert tiny.size == 6
    assert tiny.reference == {"a": "x", "b": "u"}
    assert tiny.feasible_fraction == pytest.approx(2 / 6)
    assert tiny.best_lat_diff == 1.8
    with pytest.raises(ValueError, match="every one of its 6"):
        Table(tiny.name, tiny.description, tiny.params, tiny.targets, tiny.fp32, tiny.rows[:-1])


def test_trials_to_target(tiny: Table) -> None:
    trace = trace_of(tiny, [("x", "u"), ("x", "v"), ("y", "w"), ("x", "w")])
    assert trials_to_target(trace, tiny, budget=4) == 3
    assert trials_to_target(trace_of(tiny, [("x", "u"), ("y", "v")]), tiny, budget=2) == 3
    assert best_feasible_lat_diff(trace, tiny, 2) == 1.2
    assert best_feasible_lat_diff(trace, tiny, 4) == 1.8
    assert best_feasible_lat_diff(trace, tiny, 1) is None


def test_a_row_that_quantizes_nothing_meets_no_target(tiny: Table) -> None:
    """The fp32 model within both targets, as a latency target of 1 lets timing noise make it."""
    rows = [{**row, "quantized": row["params"] != {"a": "y", "b": "w"}} for row in tiny.rows]
    table = dataclasses.replace(tiny, rows=rows)
    trace = trace_of(table, [("x", "u"), ("y", "w"), ("x", "w")])
    assert trials_to_target(trace, table, budget=3) == 3
    assert best_feasible_lat_diff(trace, table, 2) is None and table.best_lat_diff == 1.6
    assert table.feasible_fraction == pytest.approx(1 / 6)
    assert table.constraints(table.lookup({"a": "y", "b": "w"}))["latency"] > 0  # infeasible to a sampler


def test_duplicates_count_only_while_unseen_configurations_remain() -> None:
    keys = [(0,), (1,), (0,), (0,), (2,), (1,), (2,)]
    assert count_duplicates(keys, space_size=3) == 2  # after (2,) every configuration is seen
    assert count_duplicates(keys, space_size=10) == 4


def test_median_counts_missing_as_worst() -> None:
    assert median_missing_worst([1.0, None, 3.0]) == 1.0
    assert median_missing_worst([None, None, 3.0]) is None


def test_summary_of_hand_made_traces(tiny: Table) -> None:
    # Seed 0 meets both targets at trial 3; seed 1 never does and repeats the default twice.
    hit = trace_of(tiny, [("x", "u"), ("x", "v"), ("y", "w"), ("x", "w")])
    miss = trace_of(tiny, [("x", "u"), ("x", "u"), ("y", "v"), ("x", "u")])
    hit.loss, hit.sampler_seconds = [5.0, 3.0, 1.0, 2.0], 0.004
    miss.loss, miss.sampler_seconds = [5.0, 5.0, 4.0, 5.0], 0.012
    summary = summarise([hit, miss], tiny, budget=4)
    assert summary["seeds"] == 2
    assert summary["trials_to_target"] == {"median": 4.0, "q25": 3.5, "q75": 4.5, "per_seed": [3, 5]}
    assert summary["success_rate"] == 0.5
    # The best lat_diff within 1 % loss: 1.8 (y, w) and 1.0 (y, v).
    assert summary["best_lat_diff"] == {"4": pytest.approx(1.4)}
    assert summary["duplicates"] == {"median": 1.0, "per_seed": [0, 2]}
    assert summary["sampler_ms_per_trial"] == pytest.approx(2.0)  # 1 and 3 ms per trial
    # Best losses so far: 5, 3, 1, 1 and 5, 5, 4, 4.
    assert summary["best_loss_curve"] == {
        "q25": [5.0, 3.5, 1.75, 1.75],
        "median": [5.0, 4.0, 2.5, 2.5],
        "q75": [5.0, 4.5, 3.25, 3.25],
    }


def test_checkpoints_end_at_the_budget() -> None:
    assert checkpoints(4) == [4]
    assert checkpoints(50) == [25, 50]
    assert checkpoints(120) == [25, 50, 100, 120]


def test_pot_m_is_the_smallest_choice_count_above_one(tiny: Table) -> None:
    assert smallest_choice_count(tiny) == 2


@pytest.mark.parametrize("spec", ["optuna.samplers:TPESampler", HYPEROPT_TPE])
def test_runners_are_seeded_and_spend_every_trial(tiny: Table, tmp_path: Path, spec: str) -> None:
    path = tmp_path / "tiny.json"
    tiny.save(path)
    task = Task("s", spec, str(path), seed=3, budget=12, constraints=True)
    first, again = run_task(task), run_task(task)
    assert first.keys == again.keys and len(first.keys) == 12  # duplicates are spent trials
    assert run_task(Task("s", spec, str(path), seed=4, budget=12, constraints=True)).keys != first.keys
    assert first.sampler_seconds > 0


@pytest.mark.parametrize("spec", ["optuna.samplers:RandomSampler", HYPEROPT_TPE])
def test_stop_at_target_ends_each_study_at_its_first_hit(tiny: Table, tmp_path: Path, spec: str) -> None:
    path = tmp_path / "tiny.json"
    tiny.save(path)
    whole = run_task(Task("s", spec, str(path), seed=3, budget=12, constraints=True))
    stopped = run_task(Task("s", spec, str(path), seed=3, budget=12, constraints=True, stop_at_target=True))
    hit = trials_to_target(whole, tiny, 12)
    assert hit <= 12  # two of six configurations meet both targets
    assert stopped.keys == whole.keys[:hit]  # the same study, cut after its first hit
    summary = summarise([stopped], tiny, 12, stopped=True)
    assert summary["trials_to_target"]["per_seed"] == [hit]
    assert summary["best_lat_diff"] is None and summary["best_loss_curve"] is None


def test_synthetic_table_is_committed_up_to_date() -> None:
    committed = Table.load(TABLES_DIR / "synthetic_interactions.json")
    made = synthetic_table()
    assert committed.rows == made.rows and committed.params == made.params
    assert 0 < committed.feasible_fraction < 0.05
    assert not committed.met(committed.lookup(committed.reference))


def test_random_replay_on_synthetic_table(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = ["--tables", "synthetic_interactions", "--samplers", "random", "--seeds", "2", "--budget", "20"]
    report = main([*argv, "--out", str(out), "--plots-dir", str(tmp_path)])
    assert json.loads(out.read_text())["seeds"] == [0, 1]
    result = report["tables"]["synthetic_interactions"]["samplers"]["random"]
    assert all(1 <= hit <= 21 for hit in result["trials_to_target"]["per_seed"])
    assert all(0 <= d < 20 for d in result["duplicates"]["per_seed"])
    assert set(result["best_lat_diff"]) == {"20"}
    assert len(result["best_loss_curve"]["median"]) == 20
    # The report summarises the studies of seeds 0 and 1 (the metrics are checked by hand above).
    path = str(TABLES_DIR / "synthetic_interactions.json")
    replayed = [run_task(Task("random", BASELINES["random"], path, seed, 20, constraints=True)) for seed in (0, 1)]
    assert [len(t.keys) for t in replayed] == [20, 20]
    table = Table.load(path)
    assert result["duplicates"]["per_seed"] == [count_duplicates(t.keys, table.size) for t in replayed]
    expected = summarise(replayed, table, 20)
    for summary in (result, expected):
        del summary["sampler_ms_per_trial"]  # wall-clock time differs between runs
    assert result == expected
    assert (tmp_path / "samplers_synthetic_interactions.png").exists()


def test_runs_merge_into_one_report(tmp_path: Path) -> None:
    common = ["--tables", "synthetic_interactions", "--budget", "10", "--plots-dir", str(tmp_path)]
    for sampler, seeds in (("random", "2"), ("optuna-tpe", "1")):
        main([*common, "--samplers", sampler, "--seeds", seeds, "--out", str(tmp_path / f"{sampler}.json")])
    runs = [str(tmp_path / "random.json"), str(tmp_path / "optuna-tpe.json")]
    merged = main([*common, "--from-results", *runs, "--out", str(tmp_path / "merged.json")])
    samplers = merged["tables"]["synthetic_interactions"]["samplers"]
    assert {name: r["seeds"] for name, r in samplers.items()} == {"random": 2, "optuna-tpe": 1}
    assert len(merged["commands"]) == 2
    assert [v["optuna"] for v in merged["versions"]] == [optuna.__version__] * 2  # one per run
    # A run stopped at its target does not mix with whole studies.
    stopped = str(tmp_path / "stopped.json")
    main([*common, "--samplers", "random", "--seeds", "1", "--stop-at-target", "--out", stopped])
    with pytest.raises(SystemExit, match="stop_at_target"):
        main([*common, "--from-results", runs[0], stopped, "--out", str(tmp_path / "mixed.json")])


def test_gp_oracle_keeps_its_hyperparameters_through_a_study() -> None:
    from benchmarks.gp_oracle import _table_and_gps
    from benchmarks.gp_oracle import oracle_gps
    from benchmarks.gp_oracle import OracleGPSampler
    from benchmarks.gp_oracle import run_one
    from optuna_quant.samplers import DiscreteGPSampler

    table = Table.load(TABLES_DIR / "mlp.json")
    gps = oracle_gps(table, rows=120)
    fitted = [gp.theta.copy() for gp in gps]
    assert len(gps) == 2 and not np.allclose(fitted[0], fitted[1])  # accuracy and latency differ
    oracle, default = OracleGPSampler(gps, seed=5), DiscreteGPSampler(seed=5)
    for sampler in (oracle, default):
        trace = run_optuna(lambda s: sampler, table, seed=5, budget=12, constraints=True)
        assert count_duplicates(trace.keys, table.size) == 0
    used = oracle._optimizer._constraint_gps
    assert all(len(gp.X) >= 10 for gp in used)  # conditioned on the study's trials ...
    assert all(np.array_equal(gp.theta, theta) for gp, theta in zip(used, fitted))  # ... as fitted
    learnt = default._optimizer._constraint_gps
    assert not all(np.allclose(gp.theta, theta) for gp, theta in zip(learnt, fitted))
    (hit, gaps), (oracle_hit, oracle_gaps) = (run_one((str(TABLES_DIR / "mlp.json"), v, 5, 15)) for v in ("default", "oracle"))
    assert 1 <= hit <= 16 and 1 <= oracle_hit <= 16
    assert len(gaps) == 2 and np.all(np.isfinite(gaps)) and oracle_gaps is None
    # The same study run here: the same hit, and the gaps recomputed from its fitted GPs.
    sampler = DiscreteGPSampler(seed=5)
    trace = run_optuna(lambda s: sampler, table, seed=5, budget=15, constraints=True, stop_at_target=True)
    assert hit == trials_to_target(trace, table, 15)
    table_gps = _table_and_gps(str(TABLES_DIR / "mlp.json"))[1]
    expected = [
        gp.log_marginal_likelihood() - gp.log_marginal_likelihood(o.log_params)
        for gp, o in zip(sampler._optimizer._constraint_gps, table_gps)
    ]
    assert gaps == pytest.approx(expected)


@pytest.fixture
def layered() -> Table:
    """Two layers and a range estimator: reverting ``l0`` buys accuracy cheaply, ``l1`` costs speed."""
    params = {"layer:l0": ["int8", "fp32"], "layer:l1": ["int8", "fp32"], "est": ["minmax", "entropy"]}
    rows = []
    for config in configurations(params):
        acc_loss = 0.02 - 0.015 * (config["layer:l0"] == "fp32") - 0.005 * (config["est"] == "entropy")
        lat_diff = 2.0 - 0.1 * (config["layer:l0"] == "fp32") - 0.8 * (config["layer:l1"] == "fp32")
        rows.append({"params": config, "accuracy": 1 - acc_loss, "acc_loss": acc_loss, "lat_diff": lat_diff})
    return Table.from_rows(
        name="layered", description="hand-made", params=params,
        targets={"accuracy_loss": 1.0, "latency_reduce": 1.5}, fp32={"accuracy": 1.0, "latency_ms": 1.0}, rows=rows,
    )


def test_standin_prior_from_the_single_layer_rows(layered: Table, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'layered' has no per-layer measurements.*--layer-standin"):
        standin_prior(layered)
    table = layered.with_layer_standin()
    # Each layer alone in fp32, the rest as in the default configuration.
    assert table.layer_sensitivity_standin == {
        "layer:l0": {"acc_loss": pytest.approx(0.005), "lat_diff": pytest.approx(1.9)},
        "layer:l1": {"acc_loss": pytest.approx(0.02), "lat_diff": pytest.approx(1.2)},
    }
    table.save(tmp_path / "layered.json")
    assert Table.load(tmp_path / "layered.json").layer_sensitivity_standin == table.layer_sensitivity_standin
    prior = standin_prior(table)
    assert set(prior) == {"layer:l0", "layer:l1"}  # the range estimator gets no opinion
    # l0: gain 1.5 target units, cost 5 % of the speed-up; l1: no gain, 40 % of the speed-up: int8.
    assert prior["layer:l0"]["fp32"] == 0.95 and prior["layer:l1"]["fp32"] == LAYER_SCORE_RANGE[0]
    assert all(scores["fp32"] + scores["int8"] == pytest.approx(1.0) for scores in prior.values())


def test_prior_run_feeds_the_samplers(layered: Table, tmp_path: Path) -> None:
    path = tmp_path / "layered.json"
    layered.with_layer_standin().save(path)
    task = Task("oq-gp", "optuna_quant.samplers:DiscreteGPSampler", str(path), seed=0, budget=8, constraints=True)
    firsts = [run_task(dataclasses.replace(task, seed=seed, budget=1, prior="standin")).keys[0] for seed in range(20)]
    # Drawn from the prior, first trials revert l0 (score 0.95) and keep l1 in int8 (0.95); keys
    # are (est, layer:l0, layer:l1), and the range estimator, without a prior, is drawn uniformly.
    assert sum(key[1] == "fp32" for key in firsts) >= 17 and sum(key[2] == "int8" for key in firsts) >= 13
    assert 5 <= sum(key[0] == "minmax" for key in firsts) <= 15
    whole = run_task(dataclasses.replace(task, prior="standin"))
    assert len(set(whole.keys)) == 8  # and never a repeat
    with pytest.raises(SystemExit, match=r"set_prior; these have none: \['optuna-tpe'\]"):
        main(["--samplers", "optuna-tpe", "oq-gp", "--prior", "--tables", "dwsep", "--out", str(tmp_path / "x.json")])


# At the lowest-error combination: reverting l0 recovers most of the error at a small cost;
# l1 recovers nothing and costs 40 % of the speed-up.
LAYERED_SENSITIVITY = {
    "layer:l0": LayerSensitivity(error_alone=0.2, error_recovered=0.15, fp32_ms=0.1, int8_ms=0.2, revert_cost=0.05),
    "layer:l1": LayerSensitivity(error_alone=0.01, error_recovered=0.0, fp32_ms=1.0, int8_ms=0.2, revert_cost=0.4),
}


def test_sensitivity_prior_maps_the_measurement_to_the_table_parameters(layered: Table, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'layered' has no scope_errors or base_sensitivity.*--sensitivity-only --tables layered"):
        sensitivity_prior(layered)
    with pytest.raises(ValueError, match=r"scope_errors names \['mode'\]"):
        dataclasses.replace(layered, scope_errors=[{"params": {"mode": "symmetric"}, "error": 0.1}])
    errors = [{"params": {"est": "minmax"}, "error": 0.02}, {"params": {"est": "entropy"}, "error": 0.004}]
    table = dataclasses.replace(
        layered,
        scope_errors=errors,
        base_sensitivity={"params": {"est": "entropy"}, "layers": {n: s.to_dict() for n, s in LAYERED_SENSITIVITY.items()}},
    )
    table.save(tmp_path / "layered.json")
    table = Table.load(tmp_path / "layered.json")
    prior = sensitivity_prior(table)
    # The module's scores, keyed by the table's own parameter names; the reference's acc_loss
    # (0.02) is the default row's, the target 1 %.
    by_node = {name.removeprefix("layer:"): s for name, s in LAYERED_SENSITIVITY.items()}
    assert prior == choice_scores(by_node, acc_loss=0.02, accuracy_target=0.01, scope_errors=errors)
    assert prior["est"] == {"minmax": pytest.approx(0.2), "entropy": 0.9}
    # At entropy the acc_loss is predicted 5 times lower: reverting l0 buys 0.004 * 0.15 / 0.21
    # (0.29 targets) and costs 5 %, within REVERT_RESOLUTION of free for a layer whose int8
    # profiles slower (it may save the rest); l1 buys nothing and costs 40 %.
    assert unresolved_saving(by_node["l0"]) == pytest.approx(REVERT_RESOLUTION - 0.05)
    assert prior["layer:l0"] == layer_scores(0.004 * 0.15 / 0.21 / 0.01, 0.05, unresolved_saving(by_node["l0"]))
    assert 0.5 < prior["layer:l0"]["fp32"] < 0.95 and prior["layer:l1"]["fp32"] == LAYER_SCORE_RANGE[0]


def test_prior_option_names_the_source(tmp_path: Path) -> None:
    for option, name in ((["--prior"], "oq-tpe+prior"), (["--prior", "standin"], "oq-tpe+prior-standin")):
        report = main(
            ["--samplers", "oq-tpe", "--tables", "dwsep", "--seeds", "1", "--budget", "3", *option,
             "--out", str(tmp_path / "r.json"), "--plots-dir", str(tmp_path)]
        )
        assert list(report["tables"]["dwsep"]["samplers"]) == [name]
    # A table without the measurement fails before any study runs.
    with pytest.raises(ValueError, match="'synthetic_interactions' has no scope_errors or base_sensitivity"):
        main(["--samplers", "oq-gp", "--prior", "--tables", "synthetic_interactions", "--out", str(tmp_path / "x")])


@pytest.mark.parametrize("spec, queued", [("oq-tpe", True), ("oq-gp", False)])
def test_a_live_queue_replays_the_reference_and_the_start_up_trials_a_study_queues(spec: str, queued: bool) -> None:
    table = Table.load(TABLES_DIR / "mobilenet8.json")
    factory = resolve(PEERS[spec])
    startup = table_guidance(table).startup_params(table_distributions(table), 5, table.target)
    assert len(startup) == 5
    trace = run_optuna(factory, table, 0, 21, constraints=True, prior="sensitivity", live_queue=True)  # room for 5
    assert trace.keys[0] == table.key(table.reference)
    assert (trace.keys[1:6] == [table.key(params) for params in startup]) == queued
    # Without the prior there is nothing to queue but the reference.
    assert run_optuna(factory, table, 0, 2, constraints=True, live_queue=True).keys[0] == table.key(table.reference)


def test_a_live_queue_gives_the_gp_the_base_configuration_where_the_prior_predicts_it_misses() -> None:
    factory = resolve(PEERS["oq-gp"])
    for name, predicted_miss in (("mtcnn_rnet", True), ("mobilenet8", False)):
        table = Table.load(TABLES_DIR / f"{name}.json")
        guidance = table_guidance(table)
        assert guidance.predicts_base_misses(table.target) == predicted_miss
        trace = run_optuna(factory, table, 0, 5, constraints=True, prior="sensitivity", live_queue=True)  # room for 1
        base = table.key(guidance.base_params(table_distributions(table), table.target))
        assert (trace.keys[1] == base) == predicted_miss


def test_a_live_queue_is_refused_for_hyperopt_and_kept_apart_from_other_runs(tmp_path: Path) -> None:
    common = ["--tables", "dwsep", "--budget", "3", "--seeds", "1", "--plots-dir", str(tmp_path)]
    with pytest.raises(SystemExit, match="--live-queue queues trials in Optuna studies"):
        main([*common, "--samplers", HYPEROPT_TPE, "--live-queue", "--out", str(tmp_path / "h.json")])
    runs = [str(tmp_path / f"{name}.json") for name in ("plain", "live")]
    main([*common, "--samplers", "oq-gp", "--out", runs[0]])
    live = main([*common, "--samplers", "oq-gp", "--live-queue", "--out", runs[1]])
    assert live["live_queue"] and live["tables"]["dwsep"]["samplers"]["oq-gp"]["seeds"] == 1
    with pytest.raises(SystemExit, match="live_queue"):
        main([*common, "--from-results", *runs, "--out", str(tmp_path / "mixed.json")])


@pytest.mark.parametrize("name", ["dwsep", "mlp", "widecnn"])
def test_committed_model_tables_carry_the_sensitivity_of_every_layer(name: str) -> None:
    table = Table.load(TABLES_DIR / f"{name}.json")
    layers = {p for p in table.names if p.startswith("layer:")}
    assert set(table.base_sensitivity["layers"]) == layers
    sens = {n: LayerSensitivity.from_dict(measured) for n, measured in table.base_sensitivity["layers"].items()}
    # Every layer has its own int8 kernel time: none is charged to a layer whose name prefixes its own.
    assert all(s.int8_ms > 0 and s.fp32_ms > 0 and s.error_alone > 0 for s in sens.values())
    # The timed revert cost ranks the layers as the table's own rows do: the same costliest revert.
    base = {**table.reference, **table.base_sensitivity["params"]}
    all_int8 = table.lookup(base)["lat_diff"]
    rows = {n: 1 - table.lookup({**base, n: "fp32"})["lat_diff"] / all_int8 for n in layers}
    assert max(sens, key=lambda n: sens[n].revert_cost) == max(rows, key=rows.get)
    assert set(sensitivity_prior(table)) == set(table.params)


@pytest.mark.parametrize("name", ["dwsep", "mlp", "widecnn", "mobilenet8", "silero_vad", "mtcnn_rnet", "mtcnn_onet"])
def test_committed_model_tables_carry_the_error_of_every_scope_combination(name: str) -> None:
    table = Table.load(TABLES_DIR / f"{name}.json")
    scopes = {p: c for p, c in table.params.items() if not p.startswith("layer:")}
    assert [e["params"] for e in table.scope_errors] == configurations(scopes)
    assert table.scope_errors[0]["params"] == {p: c[0] for p, c in scopes.items()}  # the reference first
    best = min(table.scope_errors, key=lambda e: e["error"])
    assert table.base_sensitivity["params"] == best["params"]


def _cnn_setup(scopes: tuple[str, ...] | None = None) -> Setup:
    """The tiny CNN as build_tables measures a table's model (every scope unless ``scopes``)."""
    from benchmarks.build_tables import BENCHMARK
    from examples.tiny_cnn import build_cnn
    from examples.tiny_cnn import calibration_data
    from examples.tiny_cnn import fp32_agreement
    from optuna_quant.trial.objective import QuantizationObjective

    model = build_cnn()
    calibration = calibration_data(model)
    objective = QuantizationObjective(
        model, calibration, fp32_agreement(model), benchmark=BENCHMARK, fp32_accuracy=1.0, **({"scopes": scopes} if scopes else {})
    )
    return Setup(objective, calibration, "a tiny CNN")


def test_tables_sensitivity_is_measured_as_a_study_measures_it(tmp_path: Path) -> None:
    from benchmarks.build_tables import table_config
    from benchmarks.build_tables import with_sensitivity

    setup = _cnn_setup()
    objective = setup.objective
    # The tables' older space: one mode for activations and weights, every QDQ operator type.
    assert table_config(objective, {"range_estimator": "entropy", "granularity": "per_tensor", "mode": "asymmetric"}) == (
        QuantConfig(range_estimator="entropy", per_channel=False, activation_symmetric=False, weight_symmetric=False, op_types="qdq")
    )
    params = {**{f"layer:{n}": ["int8", "fp32"] for n in objective.space.nodes},
              "range_estimator": ["minmax", "percentile_99.9"], "granularity": ["per_channel", "per_tensor"],
              "mode": ["symmetric", "asymmetric"]}
    rows = [{"params": c, "accuracy": 1.0, "acc_loss": 0.0, "lat_diff": 1.0} for c in configurations(params)]
    table = Table.from_rows(name="cnn", description="rows unused", params=params, rows=rows,
                            targets={"accuracy_loss": 1.0, "latency_reduce": 1.5}, fp32={"accuracy": 1.0, "latency_ms": 1.0})
    measured = with_sensitivity(table, setup)
    errors = measured.scope_errors
    assert len(errors) == 2 * 2 * 2 and len({round(e["error"], 12) for e in errors}) == 8  # each changes the model
    assert measured.base_sensitivity["params"] == min(errors, key=lambda e: e["error"])["params"]
    layers = measured.base_sensitivity["layers"]
    assert set(layers) == {f"layer:{n}" for n in objective.space.nodes}
    assert all(LayerSensitivity.from_dict(s).revert_cost is not None for s in layers.values())
    measured.save(tmp_path / "cnn.json")
    assert Table.load(tmp_path / "cnn.json").base_sensitivity == measured.base_sensitivity


GRANULARITY = {"granularity": ["per_channel", "per_tensor"]}


@pytest.mark.parametrize("other_scopes", [GRANULARITY, {**GRANULARITY, "mode": ["symmetric", "asymmetric"]}])
def test_rows_that_keep_every_node_in_fp32_are_marked_unquantized(other_scopes: dict[str, list[str]]) -> None:
    """Read from the model each row builds, in today's space and in the tables' older one (``mode``)."""
    setup = _cnn_setup(None if "mode" in other_scopes else ("layer", "range_estimator", "granularity"))
    nodes = setup.objective.space.nodes
    params = {**{f"layer:{n}": ["int8", "fp32"] for n in nodes}, "range_estimator": ["minmax"], **other_scopes}
    rows = [{"params": c, "accuracy": 1.0, "acc_loss": 0.0, "lat_diff": 1.0} for c in configurations(params)]
    table = Table.from_rows(name="cnn", description="rows unused", params=params, rows=rows,
                            targets={"accuracy_loss": 1.0, "latency_reduce": 1.0}, fp32={"accuracy": 1.0, "latency_ms": 1.0})
    marked = with_quantized(table, setup)
    unquantized = [row["params"] for row in marked.rows if not row["quantized"]]
    combinations = len(configurations(other_scopes))
    assert len(unquantized) == combinations and all(row[f"layer:{n}"] == "fp32" for row in unquantized for n in nodes)
    assert marked.feasible_fraction == pytest.approx(1 - combinations / len(rows))
