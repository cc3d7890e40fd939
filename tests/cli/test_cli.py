"""The optuna-quant command on a real small model, real files and SQLite storages in tmp_path."""

from __future__ import annotations

from pathlib import Path
import re
import subprocess
import sys

from conftest import assert_int8_layers
from conftest import load_project_study
from conftest import subprocess_env
from conftest import write_project
import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest
import yaml

from optuna_quant.cli import main
from optuna_quant.measure.loss import Targets
from optuna_quant.trial.records import SPACE_KEY
from optuna_quant.trial.records import TARGETS_KEY
from optuna_quant.trial.results import best_trial


CONSOLE_SCRIPT = Path(sys.executable).with_name("optuna-quant")


def _run_cli(*args: str, cwd: Path, merged: bool = False) -> subprocess.CompletedProcess[str]:
    """The console script run with ``args``; ``merged``: stderr into stdout, in the order a terminal shows."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if merged else {"capture_output": True}
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args], cwd=cwd, env=subprocess_env(), text=True, timeout=300, **streams
    )


PROGRESS_BAR = re.compile(r"\d+/\d+ \[\d\d:\d\d")
"""tqdm's bar: trials done of the total, then the time elapsed."""


def _best(study: optuna.Study) -> optuna.trial.FrozenTrial:
    """The best trial of ``study`` by POT's rule, under the targets the study stored."""
    best = best_trial(study.trials, Targets(**study.user_attrs[TARGETS_KEY]))
    assert best is not None
    return best


def test_tune_end_to_end_from_another_directory(tmp_path, cnn, calib, agreement) -> None:
    config = write_project(tmp_path / "project", cnn, calib, agreement, export="out/best.int8.onnx")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _run_cli("tune", str(config), cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert "Trial iteration start: 2 / 3" in done.stderr  # POT's log lines show the progress
    assert "Best trial " in done.stdout and "Best configuration:" in done.stdout
    exported = tmp_path / "project" / "out" / "best.int8.onnx"
    ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    study = load_project_study(tmp_path / "project")
    assert len(study.trials) == 3
    # The exported model is the int8 model of the best trial that the run printed.
    best = _best(study)
    assert f"Best trial {best.number}:" in done.stdout
    assert_int8_layers(onnx.load(str(exported)), best.params)
    assert study.metric_names == ["loss"]
    assert not list(elsewhere.iterdir())  # every relative path resolved against the config's folder


def test_usage_errors_exit_2_with_one_line(tmp_path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("max_trails: 3\n")
    done = _run_cli("tune", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "run.yaml: unknown key 'max_trails'; did you mean 'max_trials'?" in done.stderr


def test_argument_errors_exit_2_with_one_line(capsys) -> None:
    for argv in (["tune"], ["train", "run.yaml"], ["dashboard", "--port", "eighty"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error: " in err
    assert main(["dashboard"]) == 2
    assert "give CONFIG or --storage URL" in capsys.readouterr().err


def test_options_missing_or_wrong_exit_2(tmp_path, cnn, calib, agreement, capsys) -> None:
    config = write_project(tmp_path, cnn, calib, agreement, max_trials=None)
    config.write_text(config.read_text().replace("max_trials: null\n", ""))
    assert main(["tune", str(config)]) == 2
    assert "give max_trials or max_minutes" in capsys.readouterr().err
    bad_target = write_project(tmp_path, cnn, calib, agreement, accuracy_loss=150.0)
    assert main(["tune", str(bad_target)]) == 2
    assert "accuracy_loss is a percentage" in capsys.readouterr().err
    bad_node = write_project(tmp_path, cnn, calib, agreement, nodes=["conv9"])
    assert main(["tune", str(bad_node)]) == 2
    assert "run.yaml: Node(s) ['conv9'] are not quantizable nodes" in capsys.readouterr().err


def test_entry_points_from_the_config_folder(tmp_path, cnn, calib, agreement, capsys, monkeypatch) -> None:
    config = write_project(
        tmp_path, cnn, calib, agreement, max_trials=2, eval_data=None,
        model="cli_entry_points:model", calibration_data="cli_entry_points:calibration",
        eval_fn="cli_entry_points:evaluate", eval_subset_size=50,
    )
    config.write_text(config.read_text().replace("eval_data: null\n", ""))
    (tmp_path / "cli_entry_points.py").write_text(
        "import numpy as np\n"
        "import onnx\n"
        "from optuna_quant import Top1Accuracy\n"
        "def model():\n"
        "    return onnx.load('tiny_cnn.onnx')\n"
        "def calibration():\n"
        "    return list(np.load('calib.npy')[:, None])\n"
        "with np.load('eval.npz') as data:\n"
        "    evaluate = Top1Accuracy(data['inputs'], data['labels'])\n"
    )
    monkeypatch.chdir(tmp_path)  # the entry points read their files relative to the working directory
    assert main(["tune", "run.yaml"]) == 0
    assert "Best trial " in capsys.readouterr().out
    assert len(load_project_study(tmp_path).trials) == 2


def test_worker_joins_the_existing_study(tmp_path, cnn, calib, agreement, capsys) -> None:
    folder = tmp_path / "worker"
    config = write_project(folder, cnn, calib, agreement, max_trials=2)
    assert main(["tune", str(config)]) == 0
    first = [(t.number, t.params) for t in load_project_study(folder).trials]
    joining = write_project(folder, cnn, calib, agreement, max_trials=4)
    assert main(["worker", str(joining)]) == 0
    trials = load_project_study(folder).trials
    assert len(trials) == 4 and [(t.number, t.params) for t in trials[:2]] == first
    assert sum(1 for t in trials if t.user_attrs.get("reference")) == 1  # the worker reused the scaling
    capsys.readouterr()
    other_targets = write_project(folder, cnn, calib, agreement, max_trials=6, accuracy_loss=10.0)
    assert main(["worker", str(other_targets)]) == 2
    assert "was made with another targets" in capsys.readouterr().err
    missing = write_project(tmp_path / "none", cnn, calib, agreement)
    assert main(["worker", str(missing)]) == 2
    assert "no study 'cli' in sqlite:///" in capsys.readouterr().err


def test_best_exports_the_stored_best_model(tuned, tmp_path, capsys) -> None:
    out = tmp_path / "best.int8.onnx"
    n_trials = len(load_project_study(tuned.parent).trials)
    assert main(["best", str(tuned), "--export", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Best trial " in printed and f"Exported the int8 model to {out}" in printed
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": np.zeros((1, 3, 12, 12), np.float32)})[0].shape == (1, 10)
    best = _best(load_project_study(tuned.parent))
    assert f"Best trial {best.number}:" in printed
    assert_int8_layers(onnx.load(str(out)), best.params)
    assert len(load_project_study(tuned.parent).trials) == n_trials  # eval runs no trial
    assert main(["best", str(tuned)]) == 2
    assert "give --export PATH" in capsys.readouterr().err


def test_fine_tune_then_best_of_the_fine_tune_study(tuned, capsys) -> None:
    fine = tuned.with_name("fine.yaml")
    fine.write_text(
        tuned.read_text()
        + "trials_load_method: fine_tune\nscopes: [range_estimator]\nexport: fine.int8.onnx\n"
    )
    assert main(["tune", str(fine)]) == 0
    study = load_project_study(tuned.parent, "cli-fine_tune")
    assert len(study.trials) == 3
    assert all(set(t.params) == {"range_estimator"} for t in study.trials)
    assert main(["best", str(fine)]) == 0
    printed = capsys.readouterr().out
    assert "Best trial " in printed
    exported = tuned.with_name("fine.int8.onnx")
    ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    # The fine-tune best's model: its range estimator, the layers in fp32 that the narrowed
    # space's base (the earlier best) keeps there.
    best = _best(study)
    assert f"Best trial {best.number}:" in printed
    base_fallback = {f"layer:{name}": "fp32" for name in study.user_attrs[SPACE_KEY]["base"]["fallback"]}
    tuned_best = _best(load_project_study(tuned.parent))
    assert base_fallback == {k: v for k, v in tuned_best.params.items() if k.startswith("layer:") and v == "fp32"}
    assert_int8_layers(onnx.load(str(exported)), {**base_fallback, **best.params})
    # A worker process joins the fine-tune study, on the space narrowed around the earlier best.
    space = study.user_attrs[SPACE_KEY]
    fine.write_text(fine.read_text().replace("max_trials: 3", "max_trials: 4"))
    done = _run_cli("worker", str(fine), cwd=tuned.parent)
    assert done.returncode == 0, done.stderr
    assert "Trial iteration start: 3 / 4" in done.stderr  # Optuna numbers trials from 0
    study = load_project_study(tuned.parent, "cli-fine_tune")
    assert len(study.trials) == 4 and set(study.trials[-1].params) == {"range_estimator"}
    assert study.user_attrs[SPACE_KEY] == space
    assert sum(1 for t in study.trials if t.user_attrs.get("reference")) == 1
    # A worker whose scopes give other parameters is refused before it runs a trial.
    other = fine.with_name("fine_mode.yaml")
    other.write_text(fine.read_text().replace("[range_estimator]", "[range_estimator, mode]"))
    capsys.readouterr()
    assert main(["worker", str(other)]) == 2
    assert "fine_mode.yaml: Study 'cli-fine_tune' was made with another search space" in capsys.readouterr().err
    assert len(load_project_study(tuned.parent, "cli-fine_tune").trials) == 4


def test_report_command(tuned, tmp_path, capsys) -> None:
    out = tmp_path / "report.html"
    assert main(["report", str(tuned), "--out", str(out)]) == 0
    assert f"to {out}" in capsys.readouterr().out
    text = out.read_text()
    assert text.count("Plotly.newPlot(") == 4 and "layer:conv1" in text


def test_probe_prints_the_summary_and_touches_no_storage(tmp_path, cnn, calib, agreement, capsys) -> None:
    config = write_project(tmp_path, cnn, calib, agreement)
    assert main(["probe", str(config)]) == 0
    out = capsys.readouterr().out
    for part in ("fp32 model:", "reference int8:", "int8 on this CPU:", "Suggested targets", "latency_reduce: "):
        assert part in out
    assert not (tmp_path / "study.db").exists()
    assert main(["tune", str(config), "--no-progress"]) == 0
    stored = (tmp_path / "study.db").read_bytes()
    assert main(["probe", str(config)]) == 0
    assert (tmp_path / "study.db").read_bytes() == stored


def test_tune_prints_the_probe_first_then_a_progress_bar_without_optunas_lines(tmp_path, cnn, calib, agreement) -> None:
    config = write_project(tmp_path, cnn, calib, agreement)
    done = _run_cli("tune", str(config), cwd=tmp_path, merged=True)
    assert done.returncode == 0, done.stdout
    out = done.stdout
    assert out.index("Suggested targets") < out.index("Reference (default configuration)")
    assert PROGRESS_BAR.search(out) and "3/3 [" in out
    assert "finished with value" not in out  # Optuna's per-trial line: only with --verbose
    assert "Trial iteration start: 2 / 3" in out
    more = write_project(tmp_path, cnn, calib, agreement, max_trials=4)
    joined = _run_cli("worker", str(more), "--no-progress", "--verbose", cwd=tmp_path, merged=True)
    assert joined.returncode == 0, joined.stdout
    assert not PROGRESS_BAR.search(joined.stdout)
    assert "Trial 3 finished with value" in joined.stdout


def test_any_error_is_one_line_and_verbose_adds_the_traceback(tmp_path, cnn, calib, agreement) -> None:
    config = write_project(tmp_path, cnn, calib, agreement, eval_data=None, eval_fn="failing:evaluate")
    config.write_text(config.read_text().replace("eval_data: null\n", ""))
    (tmp_path / "failing.py").write_text("def evaluate(session):\n    raise OSError('labels.npy is gone')\n")
    message = (
        "optuna-quant: error: RuntimeError: eval_fn raised on the fp32 model: OSError('labels.npy is gone') "
        "(--verbose shows the traceback)"
    )
    for args in (["tune", str(config)], ["probe", str(config)]):
        done = _run_cli(*args, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        # The progress lines of what ran before it (the model's preparation), then the one line.
        assert [line for line in done.stderr.strip().splitlines() if not line.startswith("INFO:")] == [message]
    verbose = _run_cli("--verbose", "probe", str(config), cwd=tmp_path)
    assert verbose.returncode == 2
    assert "Traceback (most recent call last)" in verbose.stderr
    assert verbose.stderr.strip().splitlines()[-1] == message


def test_a_bad_run_config_never_touches_the_stored_study(tuned, capsys) -> None:
    folder = tuned.parent
    stored = [(t.number, t.state, t.values) for t in load_project_study(folder).trials]
    base = yaml.safe_load(tuned.read_text())
    assert base.get("trials_load_method", "cold_start") == "cold_start"  # which deletes a stored study
    cases = [
        ({k: v for k, v in base.items() if k != "max_trials"}, "give max_trials or max_minutes (or both)."),
        ({**base, "max_trials": -5}, "'max_trials' must be a positive integer, got -5 (int)."),
        ({**base, "max_minutes": 0}, "'max_minutes' must be a positive number, got 0 (int)."),
        ({**base, "export": "run.yaml/best.onnx"}, f"export: cannot write {folder}/run.yaml/best.onnx: "
                                                   f"{folder}/run.yaml is a file, not a folder."),
        ({**base, "artifact_dir": "run.yaml"}, f"artifact_dir: cannot write {folder}/run.yaml: "
                                               f"{folder}/run.yaml is a file, not a folder."),
    ]
    bad = folder / "bad.yaml"
    for values, message in cases:
        bad.write_text(yaml.safe_dump(values))
        for command in ("tune", "worker"):
            assert main([command, str(bad)]) == 2
            assert capsys.readouterr().err == f"optuna-quant: error: {bad}: {message}\n"
            assert [(t.number, t.state, t.values) for t in load_project_study(folder).trials] == stored


def test_best_and_report_check_their_output_before_writing(tuned, capsys) -> None:
    target = tuned / "best.onnx"  # beneath the config file itself
    assert main(["best", str(tuned), "--export", str(target)]) == 2
    assert capsys.readouterr().err == (
        f"optuna-quant: error: --export: cannot write {target}: {tuned} is a file, not a folder.\n"
    )
    assert main(["report", str(tuned), "--out", str(tuned.parent)]) == 2
    assert f"--out: cannot write {tuned.parent}: {tuned.parent} is a folder, not a file." in capsys.readouterr().err


def test_probe_times_on_the_latency_data_of_the_config(tmp_path, cnn, calib, agreement, capsys) -> None:
    np.save(tmp_path / "batch8.npy", np.concatenate(calib)[:8])
    config = write_project(tmp_path, cnn, calib, agreement, latency_data="batch8.npy")
    assert main(["probe", str(config)]) == 0
    assert "  timed on:          input 8x3x12x12\n" in capsys.readouterr().out
