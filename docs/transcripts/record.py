"""Record what a user sees in a terminal for `make demo` and `optuna-quant probe` on the demo model.

Each command runs in a pseudo-terminal, as in a shell, so that the progress bar draws as it does
for a user; the transcript is the terminal's final screen, text only. Run from the repository
root (the demo's model cache, ``.cache/demo``, is there)::

    python docs/transcripts/record.py            # writes docs/transcripts/make-demo.txt and probe.txt

``make demo`` itself runs ``.venv/bin/python -m examples.demo``; this script runs the same module
with the Python it is started with, and stores the study in ``demo.db`` as ``make demo`` does.
"""

from __future__ import annotations

import argparse
import fcntl
import os
from pathlib import Path
import pty
import re
import struct
import subprocess
import sys
import termios


HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COLUMNS, ROWS = 110, 50
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_terminal(argv: list[str]) -> tuple[int, str]:
    """Run ``argv`` in the repository root on a pseudo-terminal; its exit status and raw output."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    env = {**os.environ, "TERM": "xterm", "COLUMNS": str(COLUMNS), "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(argv, cwd=ROOT, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closes when the process exits
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(), b"".join(chunks).decode("utf-8", errors="replace")


def screen(raw: str) -> str:
    """The text a terminal shows for ``raw``: a carriage return goes back to the line's start and
    what follows overwrites it; escape sequences (colours, cursor moves) are dropped."""
    lines = []
    for line in _ESCAPE.sub("", raw.replace("\r\n", "\n")).split("\n"):
        cells: list[str] = []
        column = 0
        for char in line:
            if char == "\r":
                column = 0
                continue
            if column < len(cells):
                cells[column] = char
            else:
                cells.append(char)
            column += 1
        lines.append("".join(cells).rstrip())
    return "\n".join(lines).rstrip() + "\n"


def record(name: str, shown: list[str], argv: list[str]) -> None:
    code, raw = run_in_terminal(argv)
    text = "".join(f"$ {line}\n" for line in shown) + screen(raw)
    (HERE / name).write_text(text, encoding="utf-8")
    print(f"wrote {HERE / name} (exit status {code})")
    if code != 0:
        sys.exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40, help="the demo's max_trials (default 40, as make demo)")
    args = parser.parse_args()
    probe = ["optuna-quant", "probe", "examples/demo_config.yaml"]
    record("probe.txt", [".venv/bin/" + " ".join(probe)], [sys.executable, "-m", "optuna_quant.cli", *probe[1:]])
    demo = [sys.executable, "-m", "examples.demo"] + ([] if args.trials == 40 else ["--trials", str(args.trials)])
    record("make-demo.txt", ["make demo", ".venv/bin/python -m examples.demo"], demo)


if __name__ == "__main__":
    main()
