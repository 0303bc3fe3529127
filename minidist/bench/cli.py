"""``minidist bench COLLECTIVE -n N [--vs gloo|mpi] ...``: the nccl-tests table."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time

from . import report
from .report import COLLECTIVES, DTYPES

EPILOG = """\
examples:
  minidist bench all_reduce -n 8 --min-bytes 8 --max-bytes 64M --factor 4
  minidist bench all_reduce -n 4 --min-bytes 4 --max-bytes 64M --factor 4 --vs gloo,mpi
  minidist bench broadcast -n 8 --min-bytes 16M --max-bytes 16M --vs gloo --json out.json
  minidist bench barrier -n 64 --vs gloo --plot barrier.png
  minidist bench pingpong -n 2 -b 8 -e 64K -f 8 --vs gloo,mpi
  minidist bench all_reduce -n 4 -b 4K -e 1M -f 4 --algorithm all --predict
  minidist bench all_reduce -n 8 --algorithm mine:rabenseifner,ring --predict
  minidist bench all_to_all -n 8 -b 64 -e 16M -f 4 --algorithm all --predict

size = bytes of the whole vector (all_gather: the gathered output; reduce_scatter and
all_to_all: the input), time = max over ranks of the mean per-iteration time, algbw =
size / time, busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
reduce_scatter, all_to_all), 1 (broadcast). 'x gloo' = gloo time / minidist time =
minidist busbw / gloo busbw.
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench", help="time collectives over a range of sizes (nccl-tests style table), "
        "optionally beside gloo and MPI",
        description="Time a collective over a range of sizes on N processes of this node "
        "and print size, count, type, time, algbw and busbw per size, as nccl-tests does. "
        "--vs runs torch's gloo or MPI over the same sizes and adds a ratio column.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", choices=COLLECTIVES)
    p.add_argument("-n", "--nproc", dest="nproc", type=int, default=2,
                   help="processes (ranks) on this node (default 2)")
    p.add_argument("-b", "--min-bytes", default="8",
                   help="smallest size, with an optional K/M/G suffix (default 8)")
    p.add_argument("-e", "--max-bytes", default="64M",
                   help="largest size, with an optional K/M/G suffix (default 64M)")
    p.add_argument("-f", "--factor", type=float, default=2.0,
                   help="multiply the size by this between rows (default 2)")
    p.add_argument("-d", "--dtype", choices=DTYPES, default="float32",
                   help="element type (default float32)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per size (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=5,
                   help="untimed calls per size before timing (default 5)")
    p.add_argument("--algorithm", default=None,
                   help="minidist's algorithm= for every call (default: minidist chooses "
                   "by size): a name, module:function (an algorithm of your own), a comma "
                   "list, or 'all' (one column each); the other systems choose their own")
    p.add_argument("--algo-module", action="append", default=[], metavar="MODULE",
                   help="a module of algorithms of your own that every rank imports "
                   "(as MINIDIST_ALGO_MODULE; repeatable)")
    p.add_argument("--predict", action="store_true",
                   help="also print the cost model's predicted time of each algorithm "
                   "and the algorithm minidist would choose, beside the measured times")
    p.add_argument("-c", "--check", action="store_true",
                   help="after timing, check one call's result on every rank (#wrong column)")
    p.add_argument("--vs", action="append", metavar="SYSTEM",
                   help="also run gloo (torch) or mpi (mpi4py + mpirun) over the same sizes "
                   "and add the ratio column; repeat or use a comma for both")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write the results as JSON: alone, to stdout instead of the table; "
                   "with FILE, to FILE (the table is still printed)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="plot busbw and latency against size, one line per system "
                   "(needs matplotlib)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every system this many times, in turn (minidist, then the "
                   "--vs systems, again and again); each time is the median over the "
                   "rounds and each ratio the median of the ratios within a round, which "
                   "a shared machine's slow spells bias less (default 1)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds each system's job may take before it is killed "
                   "(default 900)")
    return p


def _fail(msg: str) -> int:
    print(f"minidist bench: error: {msg}", file=sys.stderr)
    return 2


def run_bench(a: argparse.Namespace) -> int:
    """Validate, run minidist then each --vs system, print the table; the exit code."""
    try:
        vs = report.parse_systems(a.vs)
        lo, hi = report.parse_size(a.min_bytes), report.parse_size(a.max_bytes)
        sizes = report.size_sweep(lo, hi, a.factor)
    except ValueError as e:
        return _fail(str(e))
    if a.nproc < 1:
        return _fail("-n must be at least 1")
    if a.iters < 1 or a.warmup < 0:
        return _fail("--iters must be at least 1 and --warmup at least 0")
    if a.rounds < 1:
        return _fail("--rounds must be at least 1")
    if a.collective == "pingpong" and (a.algorithm or a.predict or a.algo_module):
        return _fail("pingpong is point-to-point: it has no algorithm to choose or predict")
    try:
        names, modules = _algorithms(a)
    except (ImportError, ValueError) as e:
        return _fail(str(e))
    from . import runner

    for system in vs:
        why = runner.missing(system)
        if why:
            return _fail(why)
    if a.plot:
        why = report.matplotlib_missing()
        if why:
            return _fail(why)

    counts = report.element_counts(a.collective, sizes, a.nproc, report.ITEMSIZE[a.dtype])
    mine = [f"minidist/{x}" for x in names] if len(names) > 1 else ["minidist"]
    results = report.Results(a.collective, a.nproc, a.dtype, counts, a.iters, a.warmup,
                             names[0] if len(names) == 1 else (a.algorithm or None),
                             a.check, [*mine, *vs], machine=runner.machine_info(vs),
                             rounds=a.rounds)
    cfg = {"collective": a.collective, "n": a.nproc, "dtype": a.dtype, "counts": counts,
           "iters": a.iters, "warmup": a.warmup,
           "algorithm": names[0] if len(names) == 1 else None, "check": a.check,
           "algo_modules": modules}
    if a.predict:
        try:
            _predict(results, names)
        except ValueError as e:
            return _fail(f"--predict: {e}")
    failed = False
    try:
        with _stop_on_signals():
            failed = _run_systems(results, cfg, a.timeout)
    except KeyboardInterrupt:
        print("minidist bench: interrupted; every job was stopped", file=sys.stderr)
        return 130
    results.machine["load_after"] = runner.load_average()

    if a.json == "-":
        sys.stdout.write(report.dumps(results))
    else:
        sys.stdout.write(report.format_table(results))
        if a.json:
            with open(a.json, "w") as f:
                f.write(report.dumps(results))
    sys.stdout.flush()
    if a.plot:
        report.plot(results, a.plot)
        _note(f"plot written to {a.plot}")
    if failed:
        return 1
    if a.check and results.wrong_total():
        print(f"minidist bench: {results.wrong_total()} wrong elements", file=sys.stderr)
        return 1
    return 0


def _algorithms(a: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(the minidist algorithms to run, by registered name; the modules of algorithms
    every rank must import). ValueError/ImportError for an unknown one."""
    import os

    from ..algorithms import ALGORITHMS, plugins
    from ..env import algorithm_modules

    modules = [*algorithm_modules(os.environ), *a.algo_module]
    plugins.load_modules(modules)
    if not a.algorithm:
        return [], modules
    specs = list(ALGORITHMS[a.collective]) if a.algorithm == "all" else \
        [x.strip() for x in a.algorithm.split(",") if x.strip()]
    names: list[str] = []
    for spec in specs:
        name = plugins.resolve(a.collective, spec)
        if ":" in spec and spec.split(":")[0] not in modules:
            modules.append(spec.split(":")[0])
        if name not in names:
            names.append(name)
    return names, modules


def _predict(results: report.Results, names: list[str]) -> None:
    """The cost model's prediction for every algorithm and size, and minidist's choice."""
    from .. import calibrate
    from ..algo_cli import minidist_choice
    from ..algorithms import IN_PLACE, cost, schedules

    c = calibrate.load()
    n, coll, itemsize = results.n, results.collective, results.itemsize
    for count in results.counts:
        per_rank = count if coll in IN_PLACE else count // n
        if coll == "barrier":
            per_rank = 0
        chosen = minidist_choice(coll, n, per_rank, results.dtype, c)
        if chosen is not None:
            results.chosen[count] = chosen
            if _fast_path(coll, n, per_rank * itemsize):
                results.fast.append(count)
        for name in names or ([chosen] if chosen else []):
            rep = cost.replay(schedules(coll, name, n, per_rank, itemsize=itemsize), c,
                              itemsize)
            results.predicted.setdefault(name, {})[count] = rep.time * 1e6


def _fast_path(collective: str, n: int, nbytes: int) -> bool:
    """Whether a call of ``nbytes`` without algorithm= takes the fast path (shared slots,
    their mid area, or reads of the peers' vectors) in a job of ``n`` processes of this
    node started from this environment, instead of the chosen algorithm (as the planner
    decides)."""
    import os

    from .. import peer_memory, segments
    from ..env import fast_path_allowed, single_copy_allowed
    from ..shm import fast_slots

    direct = single_copy_allowed(os.environ) and peer_memory.key() is not None
    return (fast_slots.takes(collective, n, nbytes, direct) and fast_slots.available()
            and segments.available() and fast_path_allowed(os.environ)
            and not os.environ.get(f"MINIDIST_ALGO_{collective.upper()}"))


def _note(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def _progress(system: str):
    def on_event(event: dict) -> None:
        if event.get("event") == "row" and sys.stderr.isatty():
            print(f"#   {system}: count {event['count']}: {event['time_us']:.1f} us",
                  file=sys.stderr, flush=True)
    return on_event


def _run_systems(results: report.Results, cfg: dict, timeout: float) -> bool:
    """Run every system's job in turn into ``results``, ``results.rounds`` times (a system
    that failed does not run again); True if one failed."""
    from . import runner

    failed = False
    for k in range(results.rounds):
        which = f" (round {k + 1} of {results.rounds})" if results.rounds > 1 else ""
        for system in results.systems:
            if system in results.errors:
                continue
            started = time.monotonic()
            _note(f"{system}: {cfg['collective']} on {cfg['n']} processes, "
                  f"{len(cfg['counts'])} size{'s' if len(cfg['counts']) != 1 else ''}"
                  f"{which}")
            job = None
            run_cfg = cfg
            if system.startswith("minidist/"):
                run_cfg = {**cfg, "algorithm": results.algorithm_of(system)}
            try:
                job = runner.run_system(system, run_cfg, timeout, _progress(system))
            except runner.BenchError as e:
                failed = True
                results.errors[system] = e.short
                print(f"minidist bench: {e}", file=sys.stderr)
                job = e.job  # the rows it printed before it failed still count
            if job is not None:
                results.add_round(system, job.measurements())
                results.info[system] = job.info()
            _note(f"{system}: {'failed after' if system in results.errors else 'done in'} "
                  f"{time.monotonic() - started:.1f} s")
    return failed


@contextlib.contextmanager
def _stop_on_signals():
    """SIGTERM and SIGHUP interrupt like Ctrl-C, so that the jobs get stopped."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
