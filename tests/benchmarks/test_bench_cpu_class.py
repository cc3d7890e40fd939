"""``benchmarks/bench_cpu_class.py``: a study stored on a CPU of another int8 class is not joined.

The stored study is the demo's, made with optuna-quant's own records; only the class it records
is another machine's (the one class this machine is not), as a file carried from there holds it.
"""

from __future__ import annotations

import json

import optuna
import pytest

from benchmarks import bench_cpu_class
from optuna_quant.measure.cpu import INT8_CLASSES
from optuna_quant.measure.cpu import int8_support
from optuna_quant.trial import records


def test_a_worker_of_another_class_is_refused_and_the_stored_trials_stay_apart(tmp_path) -> None:
    other = next(c for c in INT8_CLASSES if c != int8_support().int8_class)
    carried = tmp_path / "other.db"
    study = optuna.create_study(storage=f"sqlite:///{carried}", study_name=bench_cpu_class.STUDY_NAME)
    study.set_user_attr(records.INT8_CLASS_KEY, other)
    out = tmp_path / "classes.json"
    bench_cpu_class.main(["--trials", "0", "--resume", str(carried), "--label", "here", "--json", str(out)])
    entry = json.loads(out.read_text())["here"]
    assert entry["int8_class"] == entry["versions"]["int8_class"] == int8_support().int8_class
    refused = entry["resume"]["refused"]
    assert f"tuned on CPUs of int8 class {other!r}" in refused and repr(int8_support().int8_class) in refused
    assert entry["resume"]["study"] == {
        "trials": 0, "classes": {}, "stored_class": other, "first_on_target": None, "best": None
    }  # nothing was run or written by the refused worker
    assert "probe" not in entry and "study" not in entry  # --trials 0: nothing tuned here


def test_a_study_file_that_is_not_there_is_named_before_anything_runs(tmp_path) -> None:
    with pytest.raises(SystemExit, match="--resume .*missing.db: no such file"):
        bench_cpu_class.main(["--trials", "20", "--resume", str(tmp_path / "missing.db"), "--json", str(tmp_path / "o.json")])
    assert not (tmp_path / "o.json").exists()
