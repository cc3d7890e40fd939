"""The paired latency measurement on real onnxruntime sessions: statistic, contention and re-timing.

How well it holds under a competing job is a benchmark (benchmarks/bench_latency.py), not a
timed test: these tests assert only what no load on the machine can change.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from optuna_quant.measure.latency import _Block
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.latency import LatencyResult
from optuna_quant.measure.latency import measure_latency
from optuna_quant.measure.measurer import Measurer
from optuna_quant.quantization.config import QuantConfig


@pytest.fixture(scope="module")
def sessions(cnn: onnx.ModelProto) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    options = BenchmarkSettings().session_options()
    serialized = cnn.SerializeToString()
    return (
        ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"]),
        ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"]),
    )


@pytest.fixture(scope="module")
def feed(calib: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {"input": calib[0]}


def test_every_block_contended_uses_up_the_retimes(sessions, feed, fast_bench) -> None:
    # A threshold of a billionth: the median run of a block is always slower than its 10th percentile.
    settings = dataclasses.replace(fast_bench, contention=1e-9, retimes=4)
    result = measure_latency(*sessions, feed, settings)
    assert result.retimed == 4
    assert result.contended


def test_one_outlying_fast_run_does_not_make_a_block_contended() -> None:
    # Hundreds of sub-millisecond runs within 1 % of each other, and the fastest 8 % faster: such
    # a block, measured on a quiet machine, is steady; one preempted half of the time is not.
    runs = np.random.default_rng(0).uniform(80e-6, 80.8e-6, 800)
    runs[17] = 74e-6
    assert _Block(runs, runs).inflation() < 0.01
    preempted = runs.copy()
    preempted[::2] *= 1.3
    assert _Block(runs, preempted).inflation() > 0.05


def test_no_block_contended_times_nothing_again(sessions, feed, fast_bench) -> None:
    settings = dataclasses.replace(fast_bench, contention=1e6)
    result = measure_latency(*sessions, feed, settings)
    assert result.retimed == 0
    assert not result.contended


def test_no_retimes_leaves_contended_blocks_flagged(sessions, feed, fast_bench) -> None:
    settings = dataclasses.replace(fast_bench, contention=1e-9, retimes=0)
    result = measure_latency(*sessions, feed, settings)
    assert result.retimed == 0
    assert result.contended


@pytest.mark.parametrize("statistic", ["min", "median"])
def test_a_model_against_itself_is_as_fast(sessions, feed, fast_bench, statistic) -> None:
    result = measure_latency(*sessions, feed, dataclasses.replace(fast_bench, statistic=statistic))
    # Two sessions of one model: the ratio is 1 but for noise, which a loaded machine can make
    # large for microsecond runs; a wrong ratio (a swapped or mixed-up block) is far outside.
    assert 0.5 < result.lat_diff < 2.0
    assert result.fp32_ms > 0 and result.int8_ms > 0


@pytest.mark.parametrize("statistic", ["min", "median"])
def test_twice_the_work_measures_about_half_as_fast(cnn, feed, fast_bench, statistic) -> None:
    # The second model runs the CNN twice on the same input: two copies side by side.
    double = onnx.compose.merge_models(cnn, onnx.compose.add_prefix(cnn, "b_"), io_map=[])
    for node in double.graph.node:
        node.input[:] = ["input" if name == "b_input" else name for name in node.input]
    double.graph.input.remove(next(i for i in double.graph.input if i.name == "b_input"))
    options = fast_bench.session_options()
    single = ort.InferenceSession(cnn.SerializeToString(), options, providers=["CPUExecutionProvider"])
    twice = ort.InferenceSession(double.SerializeToString(), options, providers=["CPUExecutionProvider"])
    result = measure_latency(single, twice, feed, dataclasses.replace(fast_bench, statistic=statistic))
    assert 0.3 < result.lat_diff < 0.8


def test_old_results_still_build() -> None:
    result = LatencyResult(fp32_ms=2.0, int8_ms=1.0, lat_diff=2.0, spread=0.01)
    assert (result.retimed, result.contended) == (0, False)


def test_new_settings_from_a_config_mapping() -> None:
    settings = BenchmarkSettings.from_dict({"statistic": "median", "contention": 0.2, "retimes": 0})
    assert (settings.statistic, settings.contention, settings.retimes) == ("median", 0.2, 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"statistic": "mean"}, "benchmark.statistic"),
        ({"contention": 0.0}, "benchmark.contention"),
        ({"contention": True}, "benchmark.contention"),
        ({"retimes": -1}, "benchmark.retimes"),
        ({"retimes": 1.5}, "benchmark.retimes"),
    ],
)
def test_bad_settings_name_the_key(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        BenchmarkSettings(**kwargs)


def _tokens(batch: int, sequence: int) -> dict[str, np.ndarray]:
    ids = np.arange(1, batch * sequence + 1, dtype=np.int64).reshape(batch, sequence) % 100 + 1
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def test_every_timing_runs_on_the_latency_data_given(bert_path, bert_feeds, bert_agreement, fast_bench) -> None:
    measurer = Measurer(str(bert_path), bert_feeds, bert_agreement, benchmark=fast_bench, latency_data=_tokens(4, 48))
    measurement = measurer.measure(QuantConfig(approach="dynamic"))
    timed = "input_ids 4x48, attention_mask 4x48, token_type_ids 4x48"
    assert measurement.latency.feed == timed and measurement.user_attrs()["latency_feed"] == timed
    # Without it, the first calibration sample (benchmark.batch_size of them).
    default = Measurer(str(bert_path), bert_feeds, bert_agreement, benchmark=fast_bench)
    sequence = bert_feeds[0]["input_ids"].shape[1]
    assert default.measure(QuantConfig(approach="dynamic")).latency.feed.startswith(f"input_ids 1x{sequence},")


@pytest.mark.parametrize(
    "latency_data, message",
    [
        ({"input_ids": np.ones((1, 8), np.int64)}, r"latency_data has inputs \['input_ids'\] but the model expects"),
        ({**_tokens(1, 8), "input_ids": np.full((1, 8), 1.5)}, "latency_data: input 'input_ids' is int64 but the data is float64 with fractional"),
        ({**_tokens(1, 8), "input_ids": np.ones(8, np.int64)}, r"latency_data: input 'input_ids' has shape \(8,\)"),
        # The tiny BERT has 64 positions: a longer sequence fails in onnxruntime, before any trial.
        (_tokens(1, 100), r"The model does not run on latency_data \(input_ids 1x100, attention_mask 1x100"),
    ],
)
def test_latency_data_that_does_not_fit_the_model_is_refused_naming_it(
    bert_path, bert_feeds, bert_agreement, fast_bench, latency_data, message
) -> None:
    with pytest.raises(ValueError, match=message):
        Measurer(str(bert_path), bert_feeds, bert_agreement, benchmark=fast_bench, latency_data=latency_data)


def test_latency_data_and_a_batch_size_are_one_too_many(bert_path, bert_feeds, bert_agreement, fast_bench) -> None:
    settings = dataclasses.replace(fast_bench, batch_size=2)
    with pytest.raises(ValueError, match="latency_data and benchmark.batch_size both say what to time on"):
        Measurer(str(bert_path), bert_feeds, bert_agreement, benchmark=settings, latency_data=_tokens(2, 8))


def test_a_watcher_sees_each_block_and_stops_the_timing(sessions, feed, fast_bench) -> None:
    settings = dataclasses.replace(fast_bench, blocks=6)
    seen: list[float] = []

    def watch(ratio: float) -> bool:
        seen.append(ratio)
        return len(seen) == 2

    result = measure_latency(*sessions, feed, settings, on_block=watch)
    assert len(seen) == 2 and result.blocks == 2 and result.stopped
    assert result.lat_diff == pytest.approx(float(np.median(seen)))
    whole = measure_latency(*sessions, feed, settings, on_block=lambda ratio: False)
    assert whole.blocks == 6 and not whole.stopped


def test_a_stop_at_the_last_block_is_a_whole_measurement(sessions, feed, fast_bench) -> None:
    result = measure_latency(*sessions, feed, fast_bench, on_block=lambda ratio: True)
    assert result.blocks == 1 and result.stopped  # fast_bench times 3 blocks
    last = measure_latency(*sessions, feed, dataclasses.replace(fast_bench, blocks=1), on_block=lambda ratio: True)
    assert last.blocks == 1 and not last.stopped  # nothing was left to save
