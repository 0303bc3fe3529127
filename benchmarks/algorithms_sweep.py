"""Verify every algorithm in the simulator for every group size, count and root.

The unit tests check every size up to 17 and sample larger ones; this is the full
sweep (by default every algorithm of every collective, N = 1..64, the counts 0, 1, n-1,
n, n+1, 3n+2, 2n+11, and every root of the rooted collectives), run on every core.

    python benchmarks/algorithms_sweep.py                      # everything, N = 1..64
    python benchmarks/algorithms_sweep.py -n 1-128 --collective all_reduce
    python benchmarks/algorithms_sweep.py --algorithm reduce:rabenseifner --jobs 1
    python benchmarks/algorithms_sweep.py --module mine        # yours too

Prints one line per algorithm (cases, CPU seconds, verdict) and exits 1 if one fails.
Every root of every rooted collective makes it long (about 150,000 cases, 18 CPU
minutes on the project's 2-core machine); ``--roots few`` tries four per size.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minidist.algo_cli import parse_sizes  # noqa: E402
from minidist.algorithms import ALGORITHMS, plugins, verify  # noqa: E402


def few_roots(size: int) -> list[int]:
    """The first, second, middle and last rank."""
    return sorted({0, min(1, size - 1), size // 2, size - 1})


def check(job: tuple[str, str, int, tuple[str, ...], bool]
          ) -> tuple[str, str, int, int, float, str]:
    """Verify one algorithm at one size: (collective, algorithm, size, cases, CPU s,
    failure or "")."""
    collective, algorithm, size, modules, every_root = job
    plugins.load_modules(modules)
    start = time.process_time()
    report = verify(collective, algorithm, [size], roots=None if every_root else few_roots)
    return (collective, algorithm, size, report.cases, time.process_time() - start,
            "" if report.ok else str(report))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--sizes", default="1-64", help="group sizes (default 1-64)")
    p.add_argument("--collective", action="append", default=[],
                   help="only this collective (repeatable)")
    p.add_argument("--algorithm", action="append", default=[], metavar="COLLECTIVE:NAME",
                   help="only this algorithm (repeatable)")
    p.add_argument("--module", action="append", default=[],
                   help="import this module of algorithms first (repeatable)")
    p.add_argument("--roots", choices=("all", "few"), default="all",
                   help="every root of the rooted collectives (default), or a few (the "
                   "first, second, middle and last: about 10x quicker)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes (default: every core)")
    a = p.parse_args(argv)
    modules = tuple(a.module)
    plugins.load_modules(modules)
    sizes = parse_sizes(a.sizes)
    wanted = [tuple(x.split(":", 1)) for x in a.algorithm]
    cases = [(c, name) for c, names in ALGORITHMS.items() for name in names
             if (not a.collective or c in a.collective) and (not wanted or (c, name) in wanted)]
    if not cases:
        p.error("no algorithm matches")
    # largest sizes first: the pool's last tasks are then short ones
    jobs = [(c, name, n, modules, a.roots == "all") for n in sorted(sizes, reverse=True)
            for c, name in cases]
    totals: dict[tuple[str, str], list] = {k: [0, 0.0, []] for k in cases}
    start = time.monotonic()
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as pool:
            results = list(pool.map(check, jobs, chunksize=1))
    else:
        results = [check(j) for j in jobs]
    for c, name, size, n_cases, cpu, failure in results:
        t = totals[(c, name)]
        t[0] += n_cases
        t[1] += cpu
        if failure:
            t[2].append((size, failure))
    failed = False
    print(f"{'algorithm':36s} {'cases':>7s} {'CPU s':>7s}  N = {a.sizes}")
    for (c, name), (n_cases, cpu, failures) in totals.items():
        verdict = "ok" if not failures else "FAILS"
        print(f"{c + '/' + name:36s} {n_cases:7d} {cpu:7.1f}  {verdict}")
        if failures:  # the smallest size that fails
            failed = True
            print("   " + min(failures)[1].replace("\n", "\n   "))
    cpu = sum(t[1] for t in totals.values())
    print(f"{sum(t[0] for t in totals.values())} cases in {time.monotonic() - start:.1f} s "
          f"({cpu:.1f} CPU s, {a.jobs} process{'es' if a.jobs > 1 else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
