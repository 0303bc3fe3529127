"""Chaos benchmark: the scenarios of ``tests/chaos`` (one copy of them, in
``tests/chaos/scenarios.py``), many trials each, summed up in one table.

Every trial draws its ranks, victim, moment, size and collective from ``--seed``; a
trial's own seed (``SEED/SCENARIO/K``) is printed with any failure, so one trial can be
run again alone (``--scenarios kill --seed SEED --first K --trials 1``).

    python benchmarks/chaos.py                                  # 10 trials of each
    python benchmarks/chaos.py --trials 50 --scenarios kill,leave -n 2,4,8,16
    python benchmarks/chaos.py --sizes 4,16M --seed 7 --json chaos.json
    python benchmarks/chaos.py --scenarios shm_limits --shm 64m -n 16 --trials 20

Columns:

* trials, failed: trials run, and trials with at least one breach of the contract;
* hangs: ranks that waited out the timeout or never reported (within the scenario's
  limit + ``--margin``); wrong: a wrong error class, or the wrong rank named, or no error
  where one was due; late: an error past the scenario's limit;
* to error p50 / max (s): from the kill, SIGSTOP, departure, exit or the last rank
  entering the mismatched call, to each rank's error; for launcher_kill, from the
  launcher's SIGKILL to the last rank gone (stall's other figures, the slowest later call
  and the stopped rank's time from SIGCONT, are in the JSON's ``extra``);
* leftover procs: processes of the job still running after it should have ended;
  shm left: new ``/dev/shm/minidist-<job>-*`` files; squatter hs/frames: handshakes a
  stranger completed and data frames it received;
* errors: the error classes the ranks reported.

Needs psutil (``pip install -e ".[test]"``); the squatter scenario needs root (it
creates and deletes a throwaway local user) and is skipped without it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.scenarios import OPS, SCENARIOS, SIZES, Options, Trial, run  # noqa: E402

SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_arg(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    mult = SUFFIX.get(text[-1:], 1)
    return int(text[:-1] if text[-1:] in SUFFIX else text) * mult


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def human(nbytes: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return f"{nbytes}B"


def summarize(trials: list[Trial], by_n: bool) -> list[dict]:
    groups: dict[tuple, list[Trial]] = defaultdict(list)
    for t in trials:
        key = (t.scenario, t.params.get("n")) if by_n else (t.scenario,)
        groups[key].append(t)
    order = list(SCENARIOS)
    rows = []
    for key, ts in sorted(groups.items(), key=lambda kv: (
            order.index(kv[0][0]), tuple(x or 0 for x in kv[0][1:]))):
        run_ = [t for t in ts if not t.skipped]
        times = [x for t in run_ for x in t.times]
        squat = [t.squatter for t in run_ if t.squatter]
        classes: Counter = Counter()
        for t in run_:
            classes.update({k: v for k, v in t.classes.items() if ":" not in k})
        rows.append({
            "scenario": key[0] + (f" n={key[1]}" if by_n else ""),
            "trials": len(run_),
            "skipped": len(ts) - len(run_),
            "failed": sum(not t.ok for t in run_),
            "hangs": sum(t.hangs for t in run_),
            "wrong": sum(t.wrong for t in run_),
            "late": sum(t.late for t in run_),
            "p50": statistics.median(times) if times else None,
            "max": max(times) if times else None,
            "leftover_procs": sum(t.leftover_procs for t in run_),
            "shm_left": sum(len(t.shm_leftovers) for t in run_),
            "squat_handshakes": sum(s["handshakes"] for s in squat) if squat else None,
            "squat_frames": sum(s["frames"] for s in squat) if squat else None,
            "errors": dict(classes.most_common()),
        })
    return rows


def table(rows: list[dict]) -> str:
    head = ("scenario", "trials", "failed", "hangs", "wrong", "late", "to error p50",
            "max (s)", "leftover procs", "shm left", "squatter hs/frames", "errors")
    out = [head]
    for r in rows:
        sq = "-" if r["squat_frames"] is None else f"{r['squat_handshakes']}/{r['squat_frames']}"
        out.append((r["scenario"],
                    f"{r['trials']}" + (f" (+{r['skipped']} skipped)" if r["skipped"] else ""),
                    str(r["failed"]), str(r["hangs"]), str(r["wrong"]), str(r["late"]),
                    "-" if r["p50"] is None else f"{r['p50']:.2f}",
                    "-" if r["max"] is None else f"{r['max']:.2f}",
                    str(r["leftover_procs"]), str(r["shm_left"]), sq,
                    ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "-"))
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    lines = []
    for k, row in enumerate(out):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if k == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10, help="trials per scenario (10)")
    ap.add_argument("--first", type=int, default=0, help="number of the first trial (0)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="comma-separated, from: " + ", ".join(SCENARIOS))
    ap.add_argument("--sizes", default=",".join(human(s) for s in SIZES),
                    help="bytes per rank to draw from (suffixes K, M, G; default 4,16M)")
    ap.add_argument("-n", dest="ns", default="",
                    help="rank counts to draw from, e.g. 2,4,8,16 (default: each "
                    "scenario's own, 2..8 for kill and launcher_kill, 2..4 for the rest)")
    ap.add_argument("--seed", default="", help="the seed of every random choice")
    ap.add_argument("--margin", type=float, default=5.0,
                    help="seconds past a scenario's limit to wait before calling it a "
                    "hang (default 5)")
    ap.add_argument("--ops", default="",
                    help="collectives the streams draw from, e.g. all_reduce,broadcast "
                    "(default: " + ",".join(OPS) + ")")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="more environment for every job, e.g. MINIDIST_FASTPATH=0 "
                    "(repeatable)")
    ap.add_argument("--stop", type=float, default=0.0,
                    help="stall: keep the stopped rank stopped at least this many "
                    "seconds (default: until the others gave up and went on)")
    ap.add_argument("--shm", default="", choices=("", "1m", "64m", "full", "roomy"),
                    help="shm_limits: the /dev/shm its jobs get (1m, 64m, full: a tmpfs in "
                    "a mount namespace, root only; roomy: this machine's); default: drawn")
    ap.add_argument("--by-n", action="store_true", help="one row per scenario and n")
    ap.add_argument("--json", metavar="PATH", help="also save every trial and the table")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print each failed trial's full report (with the job's output)")
    a = ap.parse_args(argv)
    names = [s for s in a.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    seed = a.seed or secrets.token_hex(4)
    opts = Options(ns=ints(a.ns), sizes=tuple(size_arg(s) for s in a.sizes.split(",") if s),
                   wait=a.margin, stop=a.stop,
                   ops=tuple(o for o in a.ops.split(",") if o) or OPS,
                   env=tuple(tuple(kv.split("=", 1)) for kv in a.env))
    print(f"# minidist chaos: seed {seed}, {a.trials} trial(s) of {', '.join(names)}, "
          f"sizes {[human(s) for s in opts.sizes]}, n {list(opts.ns) or 'default'}",
          file=sys.stderr, flush=True)
    trials: list[Trial] = []
    start = time.monotonic()
    for name in names:
        for k in range(a.first, a.first + a.trials):
            t = run(name, seed, k, opts, **({"shm": a.shm} if a.shm and name == "shm_limits"
                                            else {}))
            trials.append(t)
            state = ("skipped: " + t.skipped) if t.skipped else \
                "ok" if t.ok else f"FAILED ({len(t.problems)}): {t.problems[0][:300]}"
            times = ",".join(f"{x:.2f}" for x in t.times[:8])
            print(f"{t.seed:>28s} {t.duration:5.1f}s {state} params={t.params} "
                  f"times=[{times}]", file=sys.stderr, flush=True)
            if a.verbose and not t.ok and not t.skipped:
                print(t.report(), file=sys.stderr, flush=True)
    rows = summarize(trials, a.by_n)
    print(table(rows))
    print(f"\nseed {seed}; {len(trials)} trials in {time.monotonic() - start:.0f} s on "
          f"{os.cpu_count()} cores", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({
            "seed": seed, "argv": sys.argv[1:], "cores": os.cpu_count(),
            "python": platform.python_version(), "machine": platform.platform(),
            "rows": rows, "trials": [t.to_json() for t in trials]}, indent=1, default=str))
    return 1 if any(not t.ok and not t.skipped for t in trials) else 0


if __name__ == "__main__":
    sys.exit(main())
