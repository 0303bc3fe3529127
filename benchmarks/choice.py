"""Is minidist's choice of algorithm the fastest? Medians of repeated runs of
``minidist bench COLLECTIVE --algorithm all --predict``.

Each run times every algorithm of the collective at every size (one job per
algorithm); this script repeats it (waiting for a quiet machine before each run, as
benchmarks/targets.py does), takes each algorithm's median time per size over the runs,
and prints, per size, minidist's choice, the fastest algorithm and the choice's time
over the fastest's, as a markdown table, then how many sizes are within the tolerance.

    python benchmarks/choice.py all_reduce -n 4 --repeat 3 --max-load 1.5
    python benchmarks/choice.py all_to_all -n 8 -b 64 -e 4M -f 16 --repeat 3

Exit status 0 when the choice is within the tolerance at all but ``--misses`` sizes.
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


def run_once(a: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "minidist", "bench", a.collective, "-n", str(a.n), "-b", a.b,
           "-e", a.e, "-f", str(a.f), "--iters", str(a.iters), "--algorithm", "all",
           "--predict", "--json", "-"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=a.timeout,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise SystemExit(f"choice.py: {' '.join(cmd[2:])} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def combine(docs: list[dict]) -> list[dict]:
    """Per size: each algorithm's median time (us) over the runs, the choice, the fastest
    and the ratio."""
    rows = []
    for i, row in enumerate(docs[0]["rows"]):
        times = {}
        for system in row["results"]:
            samples = [d["rows"][i]["results"][system]["time_us"] for d in docs
                       if system in d["rows"][i]["results"]]
            times[system.split("/", 1)[-1]] = statistics.median(samples)
        chosen = docs[0]["chosen"].get(str(row["count"]))
        best = min(times, key=times.get)
        rows.append({"size": row["size"], "count": row["count"], "times_us": times,
                     "chosen": chosen, "fastest": best,
                     "ratio": times[chosen] / times[best] if chosen in times else None,
                     "fast_path": row["count"] in docs[0].get("fast_path", [])})
    return rows


def _size(nbytes: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= k:
            return f"{nbytes / k:.3g} {unit}"
    return f"{nbytes} B"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("collective")
    p.add_argument("-n", type=int, default=4)
    p.add_argument("-b", default="4", help="smallest size (default 4)")
    p.add_argument("-e", default="16M", help="largest size (default 16M)")
    p.add_argument("-f", type=float, default=2 ** 2.75,
                   help="factor between sizes (default 2**2.75: 9 sizes from 4 B to 16 MiB)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-load", type=float, default=1.5,
                   help="wait for the 1-minute load average to fall under this (0: never)")
    p.add_argument("--wait", type=float, default=600, help="seconds to wait at most per run")
    p.add_argument("--tolerance", type=float, default=1.2)
    p.add_argument("--misses", type=int, default=1,
                   help="sizes allowed outside the tolerance (default 1)")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", metavar="FILE", help="also write the runs and the medians here")
    a = p.parse_args(argv)

    docs = []
    for rep in range(a.repeat):
        end = time.monotonic() + a.wait
        while a.max_load and os.getloadavg()[0] >= a.max_load and time.monotonic() < end:
            time.sleep(5)
        print(f"# run {rep + 1}/{a.repeat} (load {os.getloadavg()[0]:.2f})", file=sys.stderr,
              flush=True)
        docs.append(run_once(a))
    rows = combine(docs)
    algorithms = list(rows[0]["times_us"])
    print(f"{a.collective}, n = {a.n}: medians of {a.repeat} runs of `minidist bench "
          f"{a.collective} -n {a.n} -b {a.b} -e {a.e} -f {a.f:.6g} --iters {a.iters} "
          "--algorithm all --predict` (us)\n")
    print("| size | " + " | ".join(algorithms) + " | minidist chooses | fastest | ratio |")
    print("|---" * (len(algorithms) + 4) + "|")
    good = 0
    for r in rows:
        ratio = r["ratio"]
        good += ratio is not None and ratio <= a.tolerance
        cells = " | ".join(f"{r['times_us'][x]:.0f}" for x in algorithms)
        mark = "*" if r["fast_path"] else ""
        print(f"| {_size(r['size'])} | {cells} | {r['chosen']}{mark} | {r['fastest']} | "
              f"{'-' if ratio is None else f'{ratio:.2f}'} |")
    print(f"\nchoice within {a.tolerance:g}x of the fastest at {good} of {len(rows)} sizes")
    if any(r["fast_path"] for r in rows):
        print("*: without algorithm=, calls this small take the shared slots (fast path)")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": docs, "medians": rows}, indent=1) + "\n")
    return 0 if good >= len(rows) - a.misses else 1


if __name__ == "__main__":
    sys.exit(main())
