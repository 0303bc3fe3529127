"""The speed targets, each measured ``--repeat`` times, with the spread and a verdict.

Targets, all against torch's gloo on this node:

* all_reduce float32 busbw >= 2x gloo at 16 MiB and 64 MiB, n = 2, 4, 8;
* all_reduce latency <= gloo at 4 B and 1 KiB, n = 2, 4, 8;
* broadcast 16 MiB, n = 8: busbw >= 1.5x gloo;
* barrier, n = 64: latency <= gloo.

Every run is one ``minidist bench ... --json`` invocation (minidist, then gloo, then
MPI if ``--vs`` says so); a target's verdict uses the median of its ratios over the
repeats, and the table shows their min and max, so a noisy neighbour shows as a spread.

    python benchmarks/targets.py                        # 3 repeats, --vs gloo
    python benchmarks/targets.py --repeat 5 --vs gloo,mpi --json targets.json
    python benchmarks/targets.py --only latency --ns 8
    python benchmarks/targets.py --max-load 1.5       # a shared machine: wait for quiet
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def runs(ns: list[int], only: set[str]) -> list[tuple[str, list[str], list[tuple]]]:
    """(name, bench args, [(target label, count, minimum ratio), ...])."""
    out = []
    for n in ns:
        if "latency" in only:
            out.append((f"all_reduce latency n={n}",
                        ["all_reduce", "-n", str(n), "--min-bytes", "4", "--max-bytes", "1K",
                         "--factor", "256", "--iters", "500", "--warmup", "20"],
                        [(f"all_reduce 4 B, n={n}: time <= gloo", 1, 1.0),
                         (f"all_reduce 1 KiB, n={n}: time <= gloo", 256, 1.0)]))
        if "bandwidth" in only:
            out.append((f"all_reduce bandwidth n={n}",
                        ["all_reduce", "-n", str(n), "--min-bytes", "16M", "--max-bytes",
                         "64M", "--factor", "4", "--iters", "20", "--warmup", "3"],
                        [(f"all_reduce 16 MiB, n={n}: busbw >= 2x gloo", 4 * MIB, 2.0),
                         (f"all_reduce 64 MiB, n={n}: busbw >= 2x gloo", 16 * MIB, 2.0)]))
    if "broadcast" in only:
        out.append(("broadcast 16 MiB n=8",
                    ["broadcast", "-n", "8", "--min-bytes", "16M", "--max-bytes", "16M",
                     "--iters", "50", "--warmup", "5"],
                    [("broadcast 16 MiB, n=8: busbw >= 1.5x gloo", 4 * MIB, 1.5)]))
    if "barrier" in only:
        out.append(("barrier n=64", ["barrier", "-n", "64", "--iters", "200", "--warmup", "20"],
                    [("barrier n=64: time <= gloo", 0, 1.0)]))
    return out


def bench(args: list[str], vs: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "minidist", "bench", *args, "--vs", vs, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout + 60,
                       stdin=subprocess.DEVNULL)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}") from None
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--vs", default="gloo", help="gloo or gloo,mpi (default gloo)")
    p.add_argument("--ns", default="2,4,8", help="process counts for all_reduce")
    p.add_argument("--only", action="append",
                   choices=("latency", "bandwidth", "broadcast", "barrier"))
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--max-load", type=float, default=0,
                   help="before each run, wait for the 1-minute load average to fall under "
                   "this (a shared machine; default 0: do not wait)")
    p.add_argument("--max-wait", type=float, default=600,
                   help="seconds to wait for --max-load at most (then run anyway)")
    p.add_argument("--json", metavar="FILE", help="every run's document, for later study")
    a = p.parse_args(argv)
    ns = [int(x) for x in a.ns.split(",")]
    only = set(a.only or ("latency", "bandwidth", "broadcast", "barrier"))
    others = [s for s in a.vs.split(",") if s]
    docs: dict[str, list[dict]] = {}
    plan = runs(ns, only)
    for rep in range(a.repeat):
        for name, args, _ in plan:
            end = time.monotonic() + a.max_wait
            while a.max_load and os.getloadavg()[0] >= a.max_load and time.monotonic() < end:
                time.sleep(5)
            load = os.getloadavg()[0]
            print(f"# [{rep + 1}/{a.repeat}] {name} (load {load:.2f}): minidist bench "
                  f"{' '.join(args)} --vs {a.vs}", file=sys.stderr, flush=True)
            docs.setdefault(name, []).append(bench(args, a.vs, a.timeout))

    print(f"# {a.repeat} runs per row; times and ratios are medians, [min - max] the spread "
          f"of the ratio; x = other time / minidist time")
    head = f"{'target':<44}{'minidist':>12}"
    for s in others:
        head += f"{s:>12}{'x ' + s:>8}{'[min - max]':>16}"
    print(head + "  verdict")
    ok_all = True
    for name, _, targets in plan:
        for label, count, need in targets:
            cells = []
            for doc in docs[name]:
                row = next(r for r in doc["rows"] if r["count"] == count)
                cells.append(row)
            key = "busbw_gbs" if "busbw" in label else "time_us"
            unit = " GB/s" if key == "busbw_gbs" else " us"

            def med(system, cells=cells, key=key):
                vals = [c["results"][system][key] for c in cells if system in c["results"]]
                return statistics.median(vals) if vals else None

            line = f"{label:<44}{_fmt(med('minidist'), unit):>12}"
            verdict = ""
            for s in others:
                ratios = [c["ratio"][s] for c in cells if c["ratio"].get(s) is not None]
                if not ratios:
                    line += f"{'-':>12}{'-':>8}{'':>16}"
                    continue
                r = statistics.median(ratios)
                line += (f"{_fmt(med(s), unit):>12}{r:>8.2f}"
                         f"{f'[{min(ratios):.2f} - {max(ratios):.2f}]':>16}")
                if s == "gloo":
                    verdict = "met" if r >= need else f"MISSED (needs x{need:g})"
                    ok_all &= r >= need
            print(line + "  " + verdict)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(docs, f, indent=1)
    return 0 if ok_all else 1


def _fmt(v, unit):
    if v is None:
        return "-"
    return f"{v:.3f}{unit}" if unit == " GB/s" else f"{v:.0f}{unit}"


if __name__ == "__main__":
    sys.exit(main())
