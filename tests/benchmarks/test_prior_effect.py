"""``benchmarks/prior_effect.py``: the prior's effect over every seed of real replays, and the
tables whose latency target lies within the fp32 model's own readings."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks import bench_samplers
from benchmarks import prior_effect


def _replay(tmp_path, *extra: str) -> dict:
    out = tmp_path / f"replay{len(extra)}.json"
    bench_samplers.main([
        "--tables", "mtcnn_rnet", "mobilenet8", "--samplers", "oq-gp", "oq-tpe", "--seeds", "3", "--budget", "100",
        "--stop-at-target", "--jobs", "1", "--out", str(out), "--plots-dir", str(tmp_path), *extra,
    ])
    return json.loads(out.read_text())


def test_replays_with_and_without_the_prior_are_compared_seed_for_seed(tmp_path) -> None:
    without, with_prior = _replay(tmp_path), _replay(tmp_path, "--prior", "sensitivity")
    paths = []
    for i, report in enumerate((without, with_prior)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(report))
    out = tmp_path / "effect.json"
    effect = prior_effect.main(["--reports", *map(str, paths), "--out", str(out)])
    assert json.loads(out.read_text()) == effect
    assert set(effect) == {"mtcnn_rnet", "mobilenet8"}
    for table, entry in effect.items():
        for sampler, e in entry["samplers"].items():
            runs = ((without, sampler), (with_prior, sampler + "+prior"))
            medians = [r["tables"][table]["samplers"][name]["trials_to_target"]["median"] for r, name in runs]
            assert [e["median"], e["median_prior"]] == medians and e["seeds"] == 3
            assert 0.0 <= e["p_prior_worse"] <= 1.0 and e["worse"] == (e["p_prior_worse"] < prior_effect.ALPHA)
    # mtcnn_rnet's fp32 model reads on both sides of its target 1.0; mobilenet8's far below 1.35.
    assert effect["mtcnn_rnet"]["target_within_noise"] and not effect["mobilenet8"]["target_within_noise"]


def test_a_prior_that_needs_more_trials_on_every_seed_is_worse() -> None:
    effect = prior_effect.compare({s: 5 + s % 4 for s in range(20)}, {s: 12 + s % 4 for s in range(20)})
    assert effect["worse"] and effect["p_prior_worse"] < 0.001
    assert not prior_effect.compare({s: 5 for s in range(20)}, {s: 5 for s in range(20)})["worse"]


def test_reports_that_disagree_or_did_not_stop_at_the_target_are_refused() -> None:
    report = {"commands": ["x"], "stop_at_target": True, "seeds": [0, 1], "tables": {
        "t": {"samplers": {"oq-gp": {"trials_to_target": {"per_seed": [3, 4]}}}}}}
    other = copy.deepcopy(report)
    other["tables"]["t"]["samplers"]["oq-gp"]["trials_to_target"]["per_seed"] = [3, 9]
    with pytest.raises(ValueError, match="t oq-gp seed 1: 4 and 9 trials"):
        prior_effect.trials_by_seed([report, other])
    with pytest.raises(ValueError, match="not run with --stop-at-target"):
        prior_effect.trials_by_seed([{**report, "stop_at_target": False}])
    assert prior_effect.trials_by_seed([report, report]) == {("t", "oq-gp"): {0: 3, 1: 4}}
