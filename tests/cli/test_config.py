"""The config file: every key checked, paths resolved against the file, data and entry points loaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from optuna_quant.cli.config import ConfigError
from optuna_quant.cli.config import load_config
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.storages.urls import sqlite_file


def _write(folder: Path, data: object, name: str = "run.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_key_names_key_file_and_closest(tmp_path) -> None:
    path = _write(tmp_path, {"max_trial": 10})
    with pytest.raises(ConfigError, match=r"run\.yaml: unknown key 'max_trial'; did you mean 'max_trials'\?"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"unknown key 'colour'; known keys: max_trials, "):
        load_config(_write(tmp_path, {"colour": "red"}))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("max_trials", "ten", "a positive integer"),
        ("max_trials", True, "a positive integer"),
        ("max_trials", -5, "a positive integer"),
        ("max_trials", 0, "a positive integer"),
        ("max_minutes", 0, "a positive number"),
        ("max_minutes", -1.5, "a positive number"),
        ("eval_subset_size", 0, "a positive integer"),
        ("accuracy_loss", "1%", "a number"),
        ("stop_on_target", "yes", "true or false"),
        ("scopes", "layer", "a list of scope names"),
        ("trials_load_method", "hot_start", "one of cold_start, warm_start, fine_tune, eval"),
        ("eval_fn", "evaluate.py", "an entry point module:function"),
        ("benchmark", 3, "a mapping"),
        ("metrics", "0.98", "a number or a list"),
        ("objective_mode", "both", "one of loss, pareto"),
        ("layer_groups", "heads", "one of block, role"),
        ("pre_process", "bert", "true, false or transformer"),
        ("latency_data", 8, "a .npy/.npz file or an entry point"),
    ],
)
def test_wrong_type_names_the_key(tmp_path, key, value, expected) -> None:
    with pytest.raises(ConfigError, match=rf"run\.yaml: '{key}' must be {expected}"):
        load_config(_write(tmp_path, {key: value}))


def test_benchmark_and_metrics(tmp_path) -> None:
    config = load_config(_write(tmp_path, {
        "benchmark": {"warmup": 2, "blocks": 3, "min_seconds": 0.03},
        "metrics": [{"name": "top1", "baseline_value": 0.98}, {"name": "top5", "baseline_value": 1}],
    }))
    assert config.get("benchmark") == BenchmarkSettings(warmup=2, blocks=3, min_seconds=0.03)
    assert config.get("metrics") == 0.98
    assert load_config(_write(tmp_path, {"metrics": 0.5})).get("metrics") == 0.5
    with pytest.raises(ConfigError, match=r"run\.yaml: benchmark: Unknown benchmark key\(s\) \['block'\]"):
        load_config(_write(tmp_path, {"benchmark": {"block": 3}}))
    with pytest.raises(ConfigError, match="metrics\\[0\\] must have a numeric 'baseline_value'"):
        load_config(_write(tmp_path, {"metrics": [{"name": "top1"}]}))


def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    config = load_config(_write(folder, {
        "model": "models/net.onnx",
        "calibration_data": "/data/calib.npy",
        "eval_data": ["x.npy", "y.npy"],
        "export": "out/best.onnx",
        "artifact_dir": "models/",
        "storage": "sqlite:///runs.db",
    }).relative_to(tmp_path))
    assert config.get("model") == str(folder / "models" / "net.onnx")
    assert config.get("calibration_data") == "/data/calib.npy"
    assert config.get("eval_data") == [str(folder / "x.npy"), str(folder / "y.npy")]
    assert config.get("export") == str(folder / "out" / "best.onnx")
    assert config.storage == f"sqlite:///{folder}/runs.db"
    assert sqlite_file(config.storage) == folder / "runs.db"
    assert config.artifact_dir(optuna.storages.InMemoryStorage()) == folder / "models"
    assert load_config(_write(folder, {})).storage == f"sqlite:///{folder}/optuna_quant.db"
    assert load_config(_write(folder, {"storage": "journal:../study.log"})).storage == f"journal:{tmp_path}/study.log"
    for url in ("postgresql://user@db/optuna", "sqlite:///:memory:", "sqlite:////abs/runs.db", "journal:/abs/s.log", "no-scheme"):
        assert load_config(_write(folder, {"storage": url})).storage == url
    # The file SQLAlchemy opens, in a folder whose name a URL must escape, options kept.
    odd = tmp_path / "50% #1"
    odd.mkdir()
    storage = load_config(_write(odd, {"storage": "sqlite+pysqlite:///runs.db?timeout=30"})).storage
    assert storage.startswith("sqlite+pysqlite:////") and storage.endswith("/runs.db?timeout=30")
    assert sqlite_file(storage) == odd / "runs.db"


def test_files_are_loaded_as_feeds_and_eval_data(tmp_path, cnn_path, calib) -> None:
    inputs = np.concatenate(calib)
    np.save(tmp_path / "calib.npy", inputs)
    np.savez(tmp_path / "multi.npz", input=inputs)
    np.savez(tmp_path / "eval.npz", inputs=inputs, labels=np.arange(len(inputs)))
    np.save(tmp_path / "labels.npy", np.arange(len(inputs)))
    base = {"model": str(cnn_path), "calibration_data": "calib.npy", "eval_data": "eval.npz"}
    kwargs = load_config(_write(tmp_path, base)).study_kwargs()
    assert len(kwargs["calibration_data"]) == len(calib)
    np.testing.assert_array_equal(kwargs["calibration_data"][3], calib[3])
    assert kwargs["eval_data"][0].shape == inputs.shape
    assert list(kwargs["eval_data"][1]) == list(range(len(inputs)))
    assert kwargs["model"] == str(cnn_path) and kwargs["trials_load_method"] == "cold_start"
    multi = load_config(_write(tmp_path, {**base, "calibration_data": "multi.npz"}))
    feeds = multi.study_kwargs()["calibration_data"]
    assert set(feeds[0]) == {"input"} and feeds[0]["input"].shape == (1, 3, 12, 12)
    pair = load_config(_write(tmp_path, {**base, "eval_data": ["calib.npy", "labels.npy"]})).study_kwargs()
    assert pair["eval_data"][1].shape == (len(inputs),)
    with pytest.raises(ConfigError, match=r"calibration_data: file .*missing\.npy does not exist"):
        load_config(_write(tmp_path, {**base, "calibration_data": "missing.npy"})).study_kwargs()
    with pytest.raises(ConfigError, match="must hold the arrays 'inputs' and 'labels'"):
        load_config(_write(tmp_path, {**base, "eval_data": "multi.npz"})).study_kwargs()
    with pytest.raises(ConfigError, match="give exactly one of 'eval_data' and 'eval_fn'"):
        load_config(_write(tmp_path, {**base, "eval_fn": "mod:fn"})).study_kwargs()
    with pytest.raises(ConfigError, match="'model' is missing"):
        load_config(_write(tmp_path, {k: v for k, v in base.items() if k != "model"})).study_kwargs()


def test_entry_points_import_from_the_config_folder(tmp_path, cnn_path) -> None:
    (tmp_path / "cfg_entry_points.py").write_text(
        "import numpy as np\n"
        "def model():\n"
        f"    return {str(cnn_path)!r}\n"
        "def calibration():\n"
        "    return [np.zeros((1, 3, 12, 12), np.float32)] * 4\n"
        "class Scores:\n"
        "    def evaluate(session):\n"
        "        return 1.0\n"
    )
    config = load_config(_write(tmp_path, {
        "model": "cfg_entry_points:model",
        "calibration_data": "cfg_entry_points:calibration",
        "eval_fn": "cfg_entry_points:Scores.evaluate",
    }))
    kwargs = config.study_kwargs()
    assert kwargs["model"] == str(cnn_path)
    assert len(kwargs["calibration_data"]) == 4
    assert kwargs["eval_fn"](None) == 1.0
    with pytest.raises(ConfigError, match="model: cannot import module 'no_such_module'"):
        load_config(_write(tmp_path, {**config.values, "model": "no_such_module:model"})).study_kwargs()
    with pytest.raises(ConfigError, match="eval_fn: module 'cfg_entry_points' has no 'score'"):
        load_config(_write(tmp_path, {**config.values, "eval_fn": "cfg_entry_points:score"})).study_kwargs()


def test_json_and_unreadable_files(tmp_path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"max_trials": 5, "study_name": "s", "trials_load_method": "fine_tune"}))
    config = load_config(path)
    assert config.get("max_trials") == 5
    assert config.study_name == "s-fine_tune"  # the study a fine_tune run works on
    path.write_text("{max_trials: 5")
    with pytest.raises(ConfigError, match=r"run\.json: not valid JSON"):
        load_config(path)
    with pytest.raises(ConfigError, match="must hold a mapping of options, not list"):
        load_config(_write(tmp_path, [1, 2]))
    with pytest.raises(ConfigError, match="config file does not exist"):
        load_config(tmp_path / "absent.yaml")


def test_a_run_needs_a_budget_and_writable_outputs(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"run\.yaml: give max_trials or max_minutes \(or both\)\."):
        load_config(_write(tmp_path, {"export": "out/best.onnx"})).check_run()
    load_config(_write(tmp_path, {"max_minutes": 0.5, "export": "out/deeper/best.onnx"})).check_run()
    assert not (tmp_path / "out").exists()  # checked, not created
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(ConfigError, match=rf"run\.yaml: export: cannot write {tmp_path}/taken/best\.onnx: "
                                          rf"{tmp_path}/taken is a file, not a folder\."):
        load_config(_write(tmp_path, {"max_trials": 3, "export": "taken/best.onnx"})).check_run()
    with pytest.raises(ConfigError, match=r"artifact_dir: cannot write .*taken: .*taken is a file, not a folder"):
        load_config(_write(tmp_path, {"max_trials": 3, "artifact_dir": "taken"})).check_run()
    # The default artifact store, beside the SQLite file.
    with pytest.raises(ConfigError, match=r"artifact_dir: cannot write .*taken/s-artifacts"):
        load_config(_write(tmp_path, {"max_trials": 3, "storage": "sqlite:///taken/s.db"})).check_run()


def test_latency_data_is_one_feed_from_a_file_as_it_is(tmp_path, cnn_path, calib) -> None:
    np.save(tmp_path / "calib.npy", np.concatenate(calib))
    np.savez(tmp_path / "eval.npz", inputs=np.concatenate(calib), labels=np.arange(len(calib)))
    np.savez(tmp_path / "batch8.npz", input=np.zeros((8, 3, 12, 12), np.float32))
    base = {"model": str(cnn_path), "calibration_data": "calib.npy", "eval_data": "eval.npz"}
    kwargs = load_config(_write(tmp_path, {**base, "latency_data": "batch8.npz"})).measure_kwargs()
    assert set(kwargs["latency_data"]) == {"input"} and kwargs["latency_data"]["input"].shape == (8, 3, 12, 12)
    assert "latency_data" not in load_config(_write(tmp_path, base)).measure_kwargs()
    with pytest.raises(ConfigError, match=r"latency_data: file .*batch9\.npz does not exist"):
        load_config(_write(tmp_path, {**base, "latency_data": "batch9.npz"})).measure_kwargs()
