"""The file log's appends per second, and fdatasyncs per append, with fdatasync on.

Single-row entries (16 float32 features, an int64 label) appended to random models among
``--models`` (each appended to once before the clock starts, as in a server that has run a
while), in three scenarios:

* ``1-thread``: one thread appends, one entry a call;
* ``8-threads``: eight threads append at once (as eight model writers would);
* ``append_many-32``: one thread logs 32 entries of 32 models a call (a log without
  ``append_many`` is called 32 times instead, as its caller would).

Each measurement runs in a fresh process on a fresh directory. ``--before DIR`` measures a
checkout of another commit beside this one (``git worktree add DIR main``), alternating
between the two round by round, so that a machine shared with other work slows both alike;
the summary gives each one's median and the ratio. Prints one JSON line per measurement,
then one per scenario and log.

    python benchmarks/wal_append.py --before /tmp/onelog-base
    python benchmarks/wal_append.py --rounds 1 --appends 200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
SCENARIOS = ("1-thread", "8-threads", "append_many-32")

_CHILD = r"""
import json, os, random, sys, threading, time
import numpy as np
from service.storage.wal.file_log import FileWriteAheadLog

directory, scenario, models, appends = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
real_fdatasync, syncs = os.fdatasync, [0]
def counted(fd):
    syncs[0] += 1
    real_fdatasync(fd)
os.fdatasync = counted
wal = FileWriteAheadLog(directory)
rng = random.Random(0)
X, y = np.ones((1, 16), np.float32), np.zeros(1, np.int64)
for m in range(models):
    wal.append(f"m{m}", X, y)

def one_by_one(count):
    for _ in range(count):
        wal.append(f"m{rng.randrange(models)}", X, y)

def many(count):
    if hasattr(wal, "append_many"):
        from service.storage.wal import LogAppend
        for _ in range(count // 32):
            wal.append_many([LogAppend(f"m{m}", X, y) for m in rng.sample(range(models), 32)])
    else:
        for _ in range(count // 32):
            for m in rng.sample(range(models), 32):
                wal.append(f"m{m}", X, y)

syncs[0] = 0
start = time.perf_counter()
if scenario == "1-thread":
    one_by_one(appends)
elif scenario == "8-threads":
    threads = [threading.Thread(target=one_by_one, args=(appends // 8,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
else:
    many(appends)
elapsed = time.perf_counter() - start
done = appends // 8 * 8 if scenario == "8-threads" else (
    appends // 32 * 32 if scenario != "1-thread" else appends)
print(json.dumps({"appends": done, "seconds": elapsed, "fdatasyncs": syncs[0],
                  "one_log": hasattr(wal, "append_many")}))
"""


def measure(code: Path, scenario: str, models: int, appends: int, parent: str | None) -> dict:
    """One measurement, in a fresh process importing ``service`` from ``code``."""
    with tempfile.TemporaryDirectory(dir=parent) as directory:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, directory, scenario, str(models), str(appends)],
            cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True,
            text=True, check=True)
    raw = json.loads(done.stdout)
    return {"appends_per_s": round(raw["appends"] / raw["seconds"]),
            "fdatasyncs_per_append": round(raw["fdatasyncs"] / raw["appends"], 3),
            "one_log": raw["one_log"]}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout of the commit to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--appends", type=int, default=2000, help="appends a measurement")
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--dir", help="where the logs are written (default: the temp dir)")
    args = parser.parse_args(argv)
    codes = {"after": REPO} if args.before is None else {"before": args.before.resolve(),
                                                           "after": REPO}
    figures: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(args.rounds):
        for scenario in SCENARIOS:
            for label, code in codes.items():
                result = measure(code, scenario, args.models, args.appends, args.dir)
                figures.setdefault((scenario, label), []).append(result)
                print(json.dumps({"benchmark": "wal_append", "round": round_,
                                  "scenario": scenario, "log": label, **result}), flush=True)
    summary = []
    for scenario in SCENARIOS:
        rates = {}
        for label in codes:
            runs = figures[scenario, label]
            rates[label] = statistics.median(r["appends_per_s"] for r in runs)
            row = {"benchmark": "wal_append", "measure": "summary", "scenario": scenario,
                   "log": ("one log, group commit" if runs[0]["one_log"]
                           else "a file per model"),
                   "appends_per_s": round(rates[label]),
                   "fdatasyncs_per_append": statistics.median(
                       r["fdatasyncs_per_append"] for r in runs),
                   "rounds": len(runs)}
            if label == "after" and "before" in rates:
                row["speedup"] = round(rates["after"] / rates["before"], 2)
            summary.append(row)
            print(json.dumps(row), flush=True)
    return summary


if __name__ == "__main__":
    main()
