"""Workers that open one fresh SQLite file at the same moment all get the storage."""

from __future__ import annotations

from pathlib import Path
import subprocess
import sys
import time

from conftest import subprocess_env
import optuna


WORKERS, FILES = 8, 12
# Each process waits for the start file, then opens the fresh storages one after the other, in
# step with the others: every file is a race of all of them.
OPEN = """
import sys, time
from pathlib import Path
from optuna_quant.storages.factory import open_storage
folder = Path(sys.argv[1])
while not (folder / "start").exists():
    time.sleep(0.001)
for i in range(int(sys.argv[2])):
    open_storage(f"sqlite:///{folder}/fresh{i}.db")
"""


def test_workers_opening_a_fresh_sqlite_file_together_all_succeed(tmp_path: Path) -> None:
    """Each one creates Optuna's tables if they are missing; without a lock around that, the loser of
    the race failed with "table studies already exists" (a worker of a fresh study exited 1)."""
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN, str(tmp_path), str(FILES)], env=subprocess_env(), stderr=subprocess.PIPE, text=True
        )
        for _ in range(WORKERS)
    ]
    time.sleep(3)  # every interpreter up and polling (imports take about a second)
    (tmp_path / "start").touch()
    for worker in workers:
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-2000:]
    for i in range(FILES):
        assert optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/fresh{i}.db") == []  # one schema, usable
