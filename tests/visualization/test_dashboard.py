"""optuna-dashboard, started by ``optuna-quant dashboard``, on a study that the CLI ran and on the demo study.

The server is real (a subprocess on a free localhost port); the study is read back through the
dashboard's HTTP API, and headless Chromium renders the study's page with the figures the run
stored. ``UPDATE_DOCS_SCREENSHOTS=1`` copies the demo study's screenshot to docs/.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import json
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys
import time
from urllib.error import URLError
from urllib.request import urlopen

from conftest import assert_int8_layers
from conftest import load_project_study
from conftest import subprocess_env
import onnx
import optuna
import pytest

from examples import demo
from optuna_quant.measure.loss import Targets
from optuna_quant.storages.factory import open_storage
from optuna_quant.storages.urls import StorageError
from optuna_quant.testing.postgres import free_port
from optuna_quant.trial.records import SENSITIVITY_KEY
from optuna_quant.trial.records import TARGETS_KEY
from optuna_quant.trial.results import best_trial
from optuna_quant.visualization.dashboard import _save_graph_object
from optuna_quant.visualization.dashboard import DashboardFigures
from optuna_quant.visualization.dashboard import save_figures
from optuna_quant.visualization.dashboard import study_url


CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make system-deps installs it)")
DOCS = Path(__file__).resolve().parents[2] / "docs"
FIGURE_IDS = {"acc_loss-lat_diff", "pareto-front", "lat_diff-history"}


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


@contextmanager
def _serving(args: list[str], logs: Path) -> Iterator[str]:
    """``optuna-quant dashboard *args --port PORT`` in a subprocess; yields the study page it prints."""
    port = free_port()
    # Files, not pipes: the server logs every request and would block on a full pipe.
    out, err = (logs / name for name in ("dashboard.out", "dashboard.err"))
    with out.open("w") as stdout, err.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "optuna_quant.cli", "dashboard", *args, "--port", str(port)],
            stdout=stdout, stderr=stderr, env=subprocess_env(),
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    _get_json(f"http://127.0.0.1:{port}/api/studies")
                    break
                except (URLError, ConnectionError):
                    assert server.poll() is None and time.monotonic() < deadline, err.read_text()
                    time.sleep(0.2)
            match = re.search(rf"http://127\.0\.0\.1:{port}/dashboard(/studies/\d+)?", out.read_text())
            assert match, out.read_text()
            yield match.group(0)
        finally:
            server.terminate()
            server.wait(timeout=30)


def _chromium(url: str, tmp_path: Path, screenshot: Path, height: int = 900) -> str:
    """The page at ``url`` as headless Chromium renders it (its DOM), captured to ``screenshot``."""
    rendered = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", f"--window-size=1400,{height}",
            # The dashboard is a JS app: let it fetch the study and draw before the capture.
            "--virtual-time-budget=15000", "--dump-dom", f"--screenshot={screenshot}", url,
        ],
        capture_output=True, text=True, timeout=180,
    )
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    assert screenshot.read_bytes().startswith(b"\x89PNG") and screenshot.stat().st_size > 20_000
    return rendered.stdout


@pytest.fixture(scope="module")
def dashboard(tuned) -> Iterator[str]:
    """The URL of the study's page, printed by ``optuna-quant dashboard`` once it serves."""
    with _serving([str(tuned)], tuned.parent) as url:
        yield url


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


def test_the_run_stored_its_figures_for_the_dashboard(dashboard) -> None:
    root, study_id = dashboard.split("/dashboard/studies/")
    served = {g["id"]: json.loads(g["graph_object"]) for g in _get_json(f"{root}/api/studies/{study_id}")["plotly_graph_objects"]}
    assert set(served) == FIGURE_IDS | {"layer-sensitivity"}  # the study measured its sensitivity
    tradeoff = served["acc_loss-lat_diff"]
    assert tradeoff["layout"]["title"]["text"].startswith("Accuracy loss against speed-up")
    assert tradeoff["layout"]["shapes"][0]["type"] == "rect"  # the target region
    assert sum(len(trace["x"]) for trace in tradeoff["data"] if trace["mode"] == "markers"
               and trace["name"] in ("both targets met", "a target missed")) == 3


def _points(optuna_study: optuna.Study) -> int:
    """How many trials the stored history figure shows, as the dashboard's server reads it."""
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    graphs = get_plotly_graph_objects(optuna_study._storage.get_study_system_attrs(optuna_study._study_id))
    if "lat_diff-history" not in graphs:
        return 0
    stored = json.loads(graphs["lat_diff-history"])
    return sum(len(t["x"]) for t in stored["data"] if t["mode"] == "markers")


def test_a_figure_that_shrinks_is_read_back_whole_by_the_dashboards_reader() -> None:
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    study = optuna.create_study()
    storage, study_id = study._storage, study._study_id
    for points in (3000, 10):  # several chunks of study attrs, then one
        figure = {"data": [{"type": "scatter", "x": list(range(points)), "y": list(range(points))}], "layout": {}}
        _save_graph_object(storage, study_id, "fig", json.dumps(figure))
        assert json.loads(get_plotly_graph_objects(storage.get_study_system_attrs(study_id))["fig"]) == figure


def test_figures_are_refreshed_after_every_trial_when_asked(make_study) -> None:
    study = make_study(accuracy_loss=50.0, study_name="live")
    counts = []
    figures = DashboardFigures(every=0.0)
    study.optimize(n_trials=4, callbacks=[figures, lambda s, t: counts.append(_points(s))])
    # The reference is the first trial; then one more point a trial.
    assert counts == [1, 2, 3, 4]
    assert len(figures.seconds) == 4


def test_a_lone_worker_stores_the_figures_every_so_often_and_when_its_run_ends(make_study) -> None:
    study = make_study(accuracy_loss=50.0, study_name="quiet")
    study.figures.every = 3600.0  # no trial of this run ends an hour after the first
    counts = []
    study.optimize(n_trials=3, callbacks=[lambda s, t: counts.append(_points(s))])
    assert counts == [0, 0, 0]  # nothing stored on the trials' path
    assert _points(study.study) == 3  # QuantStudy.optimize stored them as its run ended
    assert len(study.figures.seconds) == 1


def test_beside_other_workers_the_figures_wait_their_turn(make_study) -> None:
    study = make_study(accuracy_loss=50.0, study_name="busy")
    study.optimize(n_trials=2)
    others = [study.study.ask(), study.study.ask()]  # trials of two other workers, running
    every = 2.0
    figures, other_worker = DashboardFigures(every=every), DashboardFigures(every=every)
    figures(study.study, study.trials[0])  # each worker's clock starts at its first trial's end
    other_worker(study.study, study.trials[0])
    assert (len(figures.seconds), len(other_worker.seconds)) == (0, 0)
    time.sleep(every)
    figures(study.study, study.trials[1])
    # Its own time is up too, but the study's is not: a store's time over COST_SHARE, at least `every`.
    other_worker(study.study, study.trials[1])
    assert (len(figures.seconds), len(other_worker.seconds)) == (1, 0)
    other_worker.flush(study.study)  # its run ends while other workers' trials run: theirs will
    assert len(other_worker.seconds) == 0
    for other in others:
        study.study.tell(other, 1.0)
    # Turned away, it looks again only `every` s later, with no read of the study meanwhile.
    other_worker(study.study, study.trials[1])
    assert len(other_worker.seconds) == 0
    other_worker.flush(study.study)  # the study's last run ends
    assert len(other_worker.seconds) == 1


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make system-deps installs it)")
def test_chromium_renders_the_study_page(dashboard, tmp_path) -> None:
    dom = _chromium(dashboard, tmp_path, tmp_path / "dashboard.png")
    study_id = dashboard.rsplit("/", 1)[1]
    assert f"cli (id={study_id})" in dom  # the study's page, not the front page
    assert ">History<" in dom and ">loss<" in dom  # the history plot, labelled with the metric name


@pytest.fixture(scope="module")
def demo_study(tmp_path_factory) -> str:
    """The storage URL of a short `make demo` run; its study measured and stored its per-layer
    sensitivity (the whole of it: 12 trials' share of the time need not afford the layers)."""
    folder = tmp_path_factory.mktemp("demo")
    storage = f"sqlite:///{folder}/demo.db"
    argv = ["--trials", "12", "--storage", storage, "--export", str(folder / "best.onnx"), "--no-progress"]
    demo.main([*argv, "--full-sensitivity"])
    study = optuna.load_study(study_name="mnist-cnn-int8", storage=storage)
    layers = {name.removeprefix("layer:") for name in study.trials[0].params if name.startswith("layer:")}
    assert set(study.user_attrs[SENSITIVITY_KEY]) == layers
    assert set(save_figures(study)) == FIGURE_IDS | {"layer-sensitivity"}
    return storage


@pytest.mark.slow
@needs_chromium
def test_chromium_shows_the_demo_studys_answer(demo_study, tmp_path) -> None:
    screenshot = tmp_path / "dashboard-figures.png"
    with _serving(["--storage", demo_study], tmp_path) as front_page:
        dom = _chromium(f"{front_page}/studies/1", tmp_path, screenshot, height=2400)
    # Plotly draws each stored figure's title and annotations into the page: missing figures fail here.
    for text in (
        "Accuracy loss against speed-up (green area: both targets met)",
        "targets: lat_diff &gt;= 1.5, acc_loss &lt;= 0.01",
        "Pareto front of acc_loss and lat_diff",
        "Speed-up per trial and the best so far",
        "Per-layer sensitivity: what int8 costs and saves, layer by layer",
    ):
        assert text in dom, text
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS") == "1":
        shutil.copyfile(screenshot, DOCS / "dashboard-figures.png")
