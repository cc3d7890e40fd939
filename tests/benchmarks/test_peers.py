"""The peers that run from environments of their own (``make peers``), through the same harness.

Each test runs the runner with the peer's python in a subprocess, as docs/real-models.md shows,
on a small workload; it is skipped, and says so, where ``make peers`` has not built that
environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess

import pytest


ROOT = Path(__file__).resolve().parents[2]


def peer_python(peer: str) -> Path:
    """The python of ``.venv-<peer>``; skips the test where it is missing."""
    python = ROOT / f".venv-{peer}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{python.relative_to(ROOT)} is missing: `make peers` builds it")
    return python


def run_peer(peer: str, method: str, model: str, tmp_path: Path, *sizes: str) -> dict:
    """The runner's record of ``method`` on ``model``, run with the peer's python; its int8 model
    is saved into ``tmp_path``."""
    out = tmp_path / "report.json"
    argv = [str(peer_python(peer)), "-m", "benchmarks.real_models.run", "--model", model, "--methods", method,
            *sizes, "--save-models", str(tmp_path), "--out", str(out)]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    return run


@pytest.mark.slow
def test_inc_tunes_a_bert_encoder_until_one_configuration_is_within_the_drop(tmp_path) -> None:
    run = run_peer("inc", "inc", "minilm", tmp_path, "--eval-size", "16", "--calibration-size", "2")
    assert "error" not in run, run.get("error")
    notes = run["notes"]
    scores, fp32 = notes["scores"], notes["fp32_score"]
    assert notes["trials"] == len(scores) >= 1
    # INC stops at its first configuration within 1 % of fp32 and at no earlier one.
    assert scores[-1] >= 0.99 * fp32 and all(score < 0.99 * fp32 for score in scores[:-1])
    assert run["acc_loss"] <= 0.011 and run["int8_layers"] > 0  # the same eval_fn, measured again here
    assert (tmp_path / "minilm-inc.onnx").is_file()
    # It ran in INC's environment (numpy<2), and the run says so wherever it is merged.
    assert run["versions"]["onnx-neural-compressor"] == "1.0" and run["versions"]["numpy"].startswith("1.")


@pytest.mark.slow
def test_olive_searches_its_quantization_pass_and_returns_the_fastest_model_within_the_drop(tmp_path) -> None:
    run = run_peer("olive", "olive", "silero_vad", tmp_path, "--eval-size", "2", "--calibration-size", "2")
    assert "error" not in run, run.get("error")
    notes = run["notes"]
    assert notes["olive_version"] == run["versions"]["olive-ai"] == "0.13.0"
    assert notes["candidates"] >= notes["evaluated"] >= notes["met_goal"] >= notes["pareto_front"] >= 1
    meeting = [c for c in notes["candidates_table"] if c["met_goal"]]
    assert all(c["score"] >= notes["score_threshold"] for c in meeting)
    # The chosen model is the fastest within the drop (no slower model within it can dominate it).
    assert notes["chosen_latency_ms"] == min(c["latency_ms"] for c in meeting)
    assert run["acc_loss"] <= 0.011 and run["int8_layers"] > 0
    assert (tmp_path / "silero_vad-olive.onnx").is_file()
