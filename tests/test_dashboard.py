"""optuna-dashboard, started by ``optuna-quant dashboard``, on a study that the CLI ran.

The server is real (a subprocess on a free localhost port); the study is read back through the
dashboard's HTTP API, and headless Chromium renders the study's page.
"""

from __future__ import annotations

from collections.abc import Iterator
import json
import re
import shutil
import subprocess
import sys
import time
from urllib.error import URLError
from urllib.request import urlopen

import onnx
import optuna
import pytest

from conftest import assert_int8_layers
from conftest import load_project_study
from conftest import subprocess_env
from optuna_quant.dashboard import study_url
from optuna_quant.loss import Targets
from optuna_quant.objective import TARGETS_KEY
from optuna_quant.results import best_trial
from optuna_quant.storage import open_storage
from optuna_quant.storage import StorageError
from optuna_quant.testing.postgres import free_port

CHROMIUM = shutil.which("chromium")


def _get_json(url: str) -> dict:
    with urlopen(url, timeout=30) as response:
        return json.load(response)


def test_study_url_from_a_url_or_an_open_storage(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(study_name="first", storage=url)
    study_id = optuna.create_study(study_name="second", storage=url)._study_id
    page = f"http://0.0.0.0:9000/dashboard/studies/{study_id}"
    assert study_url(url, "second", "0.0.0.0", 9000) == page
    assert study_url(open_storage(url), "second", "0.0.0.0", 9000) == page
    with pytest.raises(KeyError):
        study_url(url, "missing")
    with pytest.raises(StorageError, match="not a database URL"):
        study_url("no-scheme-here", "second")


@pytest.fixture(scope="module")
def dashboard(tuned) -> Iterator[str]:
    """The URL of the study's page, printed by ``optuna-quant dashboard`` once it serves."""
    port = free_port()
    # Files, not pipes: the server logs every request and would block on a full pipe.
    out, err = (tuned.with_name(name).open("w") for name in ("dashboard.out", "dashboard.err"))
    server = subprocess.Popen(
        [sys.executable, "-m", "optuna_quant.cli", "dashboard", str(tuned), "--port", str(port)],
        stdout=out, stderr=err, env=subprocess_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get_json(f"http://127.0.0.1:{port}/api/studies")
                break
            except (URLError, ConnectionError):
                log = tuned.with_name("dashboard.err")
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        printed = tuned.with_name("dashboard.out").read_text()
        match = re.search(rf"http://127\.0\.0\.1:{port}/dashboard/studies/\d+", printed)
        assert match, printed
        yield match.group(0)
    finally:
        server.terminate()
        server.wait(timeout=30)
        out.close()
        err.close()


def test_api_serves_study_metric_names_and_user_attrs(tuned, dashboard) -> None:
    root, study_id = dashboard.split("/dashboard/studies/")
    summaries = _get_json(f"{root}/api/studies")["study_summaries"]
    assert [(s["study_id"], s["study_name"]) for s in summaries] == [(int(study_id), "cli")]
    detail = _get_json(f"{root}/api/studies/{study_id}")
    assert detail["name"] == "cli" and detail["directions"] == ["minimize"]
    assert detail["objective_names"] == ["loss"]
    study = load_project_study(tuned.parent, name="cli")
    stored = study.trials
    assert len(detail["trials"]) == len(stored) == 3
    for served, trial in zip(detail["trials"], stored):
        attrs = {a["key"]: a["value"] for a in served["user_attrs"]}
        assert attrs["acc_loss"] == str(trial.user_attrs["acc_loss"])
        assert attrs["lat_diff"] == str(trial.user_attrs["lat_diff"])
        assert served["state"] == "Complete" and served["values"] == [trial.value]
    assert {"acc_loss", "lat_diff"} <= {a["key"] for a in detail["union_user_attrs"]}
    # The stored best model is served from the study's artifact store.
    (artifact,) = detail["artifacts"]
    assert re.fullmatch(r"best-trial-\d+\.int8\.onnx", artifact["filename"])
    with urlopen(f"{root}/artifacts/{study_id}/{artifact['artifact_id']}", timeout=30) as response:
        served = response.read()
    model = onnx.load_model_from_string(served)
    # It is the file of the artifact store beside the database, and the int8 model of the best trial.
    assert served == (tuned.parent / "study-artifacts" / artifact["artifact_id"]).read_bytes()
    best = best_trial(stored, Targets(**study.user_attrs[TARGETS_KEY]))
    assert best is not None and artifact["filename"] == f"best-trial-{best.number}.int8.onnx"
    assert_int8_layers(model, best.params)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make system-deps installs it)")
def test_chromium_renders_the_study_page(dashboard, tmp_path) -> None:
    screenshot = tmp_path / "dashboard.png"
    rendered = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900",
            # The dashboard is a JS app: let it fetch the study and draw before the capture.
            "--virtual-time-budget=10000", "--dump-dom", f"--screenshot={screenshot}", dashboard,
        ],
        capture_output=True, text=True, timeout=180,
    )
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    dom = rendered.stdout
    study_id = dashboard.rsplit("/", 1)[1]
    assert f"cli (id={study_id})" in dom  # the study's page, not the front page
    assert ">History<" in dom and ">loss<" in dom  # the history plot, labelled with the metric name
    assert screenshot.read_bytes().startswith(b"\x89PNG") and screenshot.stat().st_size > 20_000
