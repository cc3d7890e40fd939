"""The demo's model gives the tuner real work, `make demo`'s script runs end to end as a person reads
it, and `optuna-quant probe` runs on the demo config as docs/cli.md shows it."""

from __future__ import annotations

from pathlib import Path
import re
import subprocess
import sys

from conftest import subprocess_env
import optuna
import pytest

from examples import demo
from examples.demo_model import build_demo_model
from examples.mnist import load_mnist
import optuna_quant as oq


ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = ROOT / "docs" / "transcripts"


def _doubled(lines: list[str]) -> list[str]:
    return [a for a, b in zip(lines, lines[1:]) if a == b and a.strip()]


@pytest.fixture(scope="module")
def demo_model() -> Path:
    # The cache is the demo's own (.cache/demo): a second run, and `make demo`, start at once.
    return build_demo_model()


@pytest.mark.slow
def test_default_int8_misses_one_percent_and_a_fallback_recovers(demo_model, fast_bench) -> None:
    data = load_mnist()
    objective = oq.QuantizationObjective(
        str(demo_model),
        [data.x_train[i : i + 1] for i in range(64)],
        oq.Top1Accuracy(data.x_test, data.y_test),
        benchmark=fast_bench,
    )
    default = objective.space.default_params()
    assert objective.measure(default).acc_loss > 0.01
    # Keeping the consumer of the rescaled channels in fp32 is enough to meet the target.
    assert objective.measure({**default, "layer:/6/Conv": "fp32"}).acc_loss <= 0.01


@pytest.mark.slow
def test_demo_script_end_to_end(demo_model, tmp_path, capsys) -> None:
    storage = f"sqlite:///{tmp_path}/demo.db"
    demo.main(["--trials", "6", "--storage", storage, "--export", str(tmp_path / "best.onnx")])
    out, err = capsys.readouterr()
    # The probe first, then a progress bar (on by default) of the study's trials.
    assert out.index("Suggested targets") < out.index("Best configuration:")
    assert re.search(r"6/6 \[\d\d:\d\d", err)
    assert re.search(r"The dashboard's figures, stored \d+ times \(at most every 10 s, and at the end\), took \d+ ms a store\.", out)
    assert f"optuna-dashboard {storage}" in out
    assert (tmp_path / "best.onnx").is_file()
    study = optuna.load_study(study_name="mnist-cnn-int8", storage=storage)
    assert len(study.trials) == 6


@pytest.mark.slow
def test_probe_on_the_demo_config_as_the_docs_show_it(demo_model) -> None:
    """`.venv/bin/optuna-quant probe examples/demo_config.yaml`, from the repository root."""
    database = ROOT / "demo.db"  # the config's storage, which the probe must not touch
    before = database.read_bytes() if database.exists() else None
    done = subprocess.run(
        [str(Path(sys.executable).with_name("optuna-quant")), "probe", "examples/demo_config.yaml"],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    # Only the package's own INFO lines (the one-off calibration), each once, and no warning.
    lines = done.stderr.splitlines()
    assert all(line.startswith("INFO:optuna_quant") for line in lines), done.stderr
    assert len(lines) == len(set(lines)), done.stderr
    measured = re.search(r"reference int8:    acc_loss (\d\.\d{4}) \((\d+\.\d\d) % of fp32 accuracy\), lat_diff ",
                         done.stdout)
    assert measured and float(measured.group(1)) > 0.01  # the demo model misses 1 % in int8 (above)
    assert f"accuracy_loss: 1.0     # percent: the reference loses {measured.group(2)} %" in done.stdout
    assert (database.read_bytes() if database.exists() else None) == before


@pytest.mark.parametrize("name", ["make-demo.txt", "probe.txt"])
def test_the_committed_transcripts_read_as_a_person_needs(name) -> None:
    """docs/transcripts/ (python docs/transcripts/record.py): no doubled line, no warning flood."""
    lines = (TRANSCRIPTS / name).read_text().splitlines()
    assert _doubled(lines) == []
    assert not [line for line in lines if "Expected bias" in line or line.startswith("WARNING:root")]
    assert any(line.startswith("Suggested targets") for line in lines)
    if name == "make-demo.txt":
        assert any(re.search(r"100%\|.*\| 40/40 \[", line) for line in lines)  # the bar, at its end
        assert not [line for line in lines if re.search(r"trial/s\]\S", line)]  # no log text glued to the bar
