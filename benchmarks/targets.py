"""The speed targets, each measured ``--repeat`` times, with the spread and a verdict.

Targets (all_reduce of float32 on the processes of this node unless named):

* 4 B: at most 25 us at n = 2 and 60 us at n = 4 (the time itself);
* n = 4, beside gloo: 5x faster at 4 B, 20x at 1 KiB, 64 KiB and 256 KiB, 2.5x at 16 MiB;
* n = 2, 4 and 8, beside Open MPI: busbw at least 0.5x MPI's at 64 KiB - 1 MiB and 1.0x
  at 4 - 64 MiB;
* barrier, n = 64: at most 2 ms.

Every run is one ``minidist bench ... --json`` invocation (minidist, then gloo, then
MPI if ``--vs`` says so): one from 4 B to 1 MiB with many calls per size (after 2000
untimed ones: calls in the first tenth of a second or so after init() run slower,
while the job finishes starting), one from 4
to 64 MiB with 30 per size (after 5 untimed ones) in ``--rounds`` rounds (every system
runs once per round, in turn; its ratio is the median of the ratios within a round, so
that a slow spell of the machine, which lasts longer than a round, weighs on both sides
of it alike). A target's verdict uses the median of its values over the repeats, and
the table shows the ratios' min and max, so a noisy neighbour shows as a spread.
After the targets, every size of every run as medians (``--rows``: a markdown table).

    python benchmarks/targets.py                        # 3 repeats, --vs gloo,mpi
    python benchmarks/targets.py --repeat 5 --json targets.json --rows rows.md
    python benchmarks/targets.py --ns 2 --only small
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
KIB, MIB = 1 << 10, 1 << 20
FLOAT = 4
# (label, bytes, what is compared, the bound): "max_us" bounds minidist's own time,
# "gloo" and "mpi" the ratio other / minidist (time, or busbw for the large rows)
LATENCY = {2: 25.0, 4: 60.0}
VS_GLOO = {4: [(4, 5.0), (KIB, 20.0), (64 * KIB, 20.0), (256 * KIB, 20.0), (16 * MIB, 2.5)]}
VS_MPI = [(64 * KIB, 0.5), (256 * KIB, 0.5), (MIB, 0.5), (4 * MIB, 1.0), (16 * MIB, 1.0),
          (64 * MIB, 1.0)]


def _size(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else (
        f"{nbytes // KIB} KiB" if nbytes >= KIB else f"{nbytes} B")


def runs(ns: list[int], only: set[str], rounds: int = 1
         ) -> list[tuple[str, list[str], list[tuple]]]:
    """(name, bench args, [(target label, count, compared with, bound), ...])."""
    out = []
    for n in ns:
        small, large = [], []
        if n in LATENCY:
            small.append((f"all_reduce 4 B, n={n}: <= {LATENCY[n]:g} us", 1, "max_us",
                          LATENCY[n]))
        for nbytes, need in VS_GLOO.get(n, []):
            where = small if nbytes <= MIB else large
            where.append((f"all_reduce {_size(nbytes)}, n={n}: >= {need:g}x gloo",
                          nbytes // FLOAT, "gloo", need))
        for nbytes, need in VS_MPI:
            where = small if nbytes <= MIB else large
            where.append((f"all_reduce {_size(nbytes)}, n={n}: >= {need:g}x mpi",
                          nbytes // FLOAT, "mpi", need))
        if "small" in only:
            out.append((f"all_reduce 4 B - 1 MiB n={n}",
                        ["all_reduce", "-n", str(n), "--min-bytes", "4", "--max-bytes", "1M",
                         "--factor", "4", "--iters", "300", "--warmup", "2000"], small))
        if "large" in only:
            out.append((f"all_reduce 4 - 64 MiB n={n}",
                        ["all_reduce", "-n", str(n), "--min-bytes", "4M", "--max-bytes",
                         "64M", "--factor", "4", "--iters", "30", "--warmup", "5",
                         "--rounds", str(rounds)], large))
    if "barrier" in only:
        out.append(("barrier n=64", ["barrier", "-n", "64", "--iters", "200", "--warmup", "20"],
                    [("barrier n=64: <= 2000 us", 0, "max_us", 2000.0)]))
    return out


def bench(args: list[str], vs: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "minidist", "bench", *args, "--vs", vs, "--json"]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 1
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                       timeout=(timeout + 60) * rounds,
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
    p.add_argument("--vs", default="gloo,mpi", help="gloo, mpi or both (default gloo,mpi)")
    p.add_argument("--ns", default="2,4,8", help="process counts for all_reduce")
    p.add_argument("--only", action="append", choices=("small", "large", "barrier"))
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of the 4 - 64 MiB runs (minidist bench --rounds; default 3)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--max-load", type=float, default=0,
                   help="before each run, wait for the 1-minute load average to fall under "
                   "this (a shared machine; default 0: do not wait)")
    p.add_argument("--max-wait", type=float, default=600,
                   help="seconds to wait for --max-load at most (then run anyway)")
    p.add_argument("--json", metavar="FILE", help="every run's document, for later study")
    p.add_argument("--rows", metavar="FILE", help="every size's medians as a markdown table")
    a = p.parse_args(argv)
    ns = [int(x) for x in a.ns.split(",")]
    only = set(a.only or ("small", "large", "barrier"))
    others = [s for s in a.vs.split(",") if s]
    docs: dict[str, list[dict]] = {}
    plan = runs(ns, only, a.rounds)
    for rep in range(a.repeat):
        for name, args, _ in plan:
            end = time.monotonic() + a.max_wait
            while a.max_load and os.getloadavg()[0] >= a.max_load and time.monotonic() < end:
                time.sleep(5)
            load = os.getloadavg()[0]
            print(f"# [{rep + 1}/{a.repeat}] {name} (load {load:.2f}): minidist bench "
                  f"{' '.join(args)} --vs {a.vs}", file=sys.stderr, flush=True)
            docs.setdefault(name, []).append(bench(args, a.vs, a.timeout))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(docs, f, indent=1)

    print(f"# {a.repeat} runs per row; times and ratios are medians, [min - max] the spread "
          f"of the ratio; x = other time / minidist time (= minidist busbw / other busbw)")
    head = f"{'target':<36}{'minidist':>12}"
    for s in others:
        head += f"{s:>12}{'x ' + s:>8}{'[min - max]':>16}"
    print(head + "  verdict")
    ok_all = True
    for name, _, targets in plan:
        for label, count, against, need in targets:
            cells = [next(r for r in doc["rows"] if r["count"] == count)
                     for doc in docs[name]]
            key = "busbw_gbs" if count * FLOAT >= 64 * KIB else "time_us"
            unit = " GB/s" if key == "busbw_gbs" else " us"

            def med(system, cells=cells, key=key):
                vals = [c["results"][system][key] for c in cells if system in c["results"]]
                return statistics.median(vals) if vals else None

            line = f"{label:<36}{_fmt(med('minidist'), unit):>12}"
            ok = None
            if against == "max_us":
                t = statistics.median(c["results"]["minidist"]["time_us"] for c in cells)
                ok = t <= need
            for s in others:
                ratios = [c["ratio"][s] for c in cells if c["ratio"].get(s) is not None]
                if not ratios:
                    line += f"{'-':>12}{'-':>8}{'':>16}"
                    continue
                r = statistics.median(ratios)
                line += (f"{_fmt(med(s), unit):>12}{r:>8.2f}"
                         f"{f'[{min(ratios):.2f} - {max(ratios):.2f}]':>16}")
                if s == against:
                    ok = r >= need
            if ok is not None:
                ok_all &= ok
            print(line + "  " + {True: "met", False: "MISSED", None: "-"}[ok])
    if a.rows:
        with open(a.rows, "w") as f:
            f.write(rows_table(plan, docs, others))
    return 0 if ok_all else 1


def rows_table(plan, docs: dict[str, list[dict]], others: list[str]) -> str:
    """Every size of every run: medians over the repeats, as a markdown table."""
    head = "| run | size | minidist |" + "".join(f" {s} | x {s} |" for s in others)
    lines = [head, "|" + "---|" * (3 + 2 * len(others))]
    for name, _, _ in plan:
        first = docs[name][0]
        for row in first["rows"]:
            count = row["count"]
            cells = [next(r for r in doc["rows"] if r["count"] == count)
                     for doc in docs[name]]
            nbytes = row.get("size", count * FLOAT)
            key = "busbw_gbs" if nbytes >= 64 * KIB else "time_us"
            unit = " GB/s" if key == "busbw_gbs" else " us"

            def med(system, cells=cells, key=key):
                vals = [c["results"][system][key] for c in cells if system in c["results"]]
                return statistics.median(vals) if vals else None

            line = f"| {name} | {_size(nbytes) if count else '-'} | " \
                   f"{_fmt(med('minidist'), unit)} |"
            for s in others:
                ratios = [c["ratio"][s] for c in cells if c["ratio"].get(s) is not None]
                line += f" {_fmt(med(s), unit)} | " + \
                    (f"{statistics.median(ratios):.2f} |" if ratios else "- |")
            lines.append(line)
    return "\n".join(lines) + "\n"


def _fmt(v, unit):
    if v is None:
        return "-"
    return f"{v:.3f}{unit}" if unit == " GB/s" else f"{v:.0f}{unit}"


if __name__ == "__main__":
    sys.exit(main())
