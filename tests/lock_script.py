"""A worker of the study lock alone, run as its own OS process by ``tests/storages/test_lock.py``.

It opens the storage as a worker does, creates the study if no other worker has, and takes the study's lock ``--times`` times; each time it
adds one to a number kept in a file, reading and writing it in two steps with a pause between,
so that two holders at once would lose an addition. With ``--die-holding`` it takes the lock,
says so in the file ``--held``, and SIGKILLs itself while it holds it.

Example:
    $ python tests/lock_script.py journal:/tmp/s.log --study s --count /tmp/count --times 20
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import signal
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import optuna  # noqa: E402

from optuna_quant.storages.factory import open_storage  # noqa: E402
from optuna_quant.storages.heartbeat import Heartbeat  # noqa: E402
from optuna_quant.storages.lock import study_lock  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("storage")
    parser.add_argument("--study", required=True)
    parser.add_argument("--count", type=Path, required=True, help="the file that holds the number")
    parser.add_argument("--times", type=int, default=0)
    parser.add_argument("--die-holding", type=Path, metavar="HELD", help="SIGKILL this process while it holds the lock")
    parser.add_argument("--heartbeat", default="1,2", help="heartbeat interval and grace period, seconds")
    args = parser.parse_args(argv)
    interval, grace = (int(v) for v in args.heartbeat.split(","))
    storage = open_storage(args.storage, grace_period=grace)
    optuna.create_study(storage=storage, study_name=args.study, load_if_exists=True)  # a lease lives in its study
    lock = study_lock(storage, args.study, Heartbeat(interval, grace))
    for _ in range(args.times):
        with lock():
            number = int(args.count.read_text())
            time.sleep(0.01)
            args.count.write_text(str(number + 1))
    if args.die_holding:
        with lock():
            args.die_holding.write_text("held")
            os.kill(os.getpid(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
