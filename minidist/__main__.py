"""The ``minidist`` command line: ``minidist run -n N script.py [args...]``,
``minidist bench COLLECTIVE -n N [--vs gloo|mpi]``, ``minidist algo ...``,
``minidist trace merge DIR``."""

from __future__ import annotations

import argparse
import os
import sys

from .env import start_method


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="launch N processes of a script on this node",
                       description="Launch N processes of a Python script (or -m module) "
                       "with minidist's environment set; relay their output prefixed with "
                       "the rank; exit with the first failing rank's code.")
    p.add_argument("-n", "-np", "--nproc-per-node", "--nproc_per_node", "--nproc",
                   dest="nproc", type=int, default=1,
                   help="processes on this node (default 1); -np and torchrun's "
                   "--nproc_per_node work too")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0,
                   help="this node's index")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr",
                   default=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                   help="address of node 0 (default 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int,
                   default=int(os.environ.get("MINIDIST_PORT", 0)),
                   help="minidist's TCP port on node 0 (default: MINIDIST_PORT or any free)")
    p.add_argument("--standalone", action="store_true",
                   help="one node, on loopback, any free port (as torchrun's --standalone)")
    p.add_argument("-x", dest="export", action="append", default=[], metavar="VAR[=VALUE]",
                   help="set VAR in every rank's environment (to VALUE, or to its value "
                   "here), as mpirun's -x; repeatable")
    p.add_argument("--algo-module", dest="algo_modules", action="append", default=[],
                   metavar="MODULE", help="a module of your own algorithms, imported by every "
                   "rank (sets MINIDIST_ALGO_MODULE); repeatable")
    p.add_argument("--log-dir", "--log_dir", dest="log_dir", default=None,
                   help="also write each rank's output to DIR/rank<K>.log")
    p.add_argument("--secret-file", dest="secret_file", default=None, metavar="PATH",
                   help="read the job secret from PATH (mode 0600; the same on every "
                   "node); without it, a job of several nodes derives a public one")
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds the other ranks get to report after one fails (default 5)")
    p.add_argument("--no-prefix", action="store_true", help="do not prefix output lines")
    p.add_argument("--verbose", action="store_true",
                   help="at the end, say how much of /dev/shm the job's ranks held at most "
                   "(looked at every 0.1 s and 2 ms more per rank, from /dev/shm and /proc)")
    p.add_argument("--restart-failed", dest="restart_failed", type=int, default=0,
                   metavar="N", help="start a rank that died (or raised) again, with the "
                   "same RANK, up to N times while the others keep running (default 0: "
                   "a failing rank stops the job)")
    p.add_argument("--start-method", choices=("fork", "spawn"),
                   default=start_method(os.environ),
                   help="fork the ranks from a launcher that has imported numpy and "
                   "minidist (default), or spawn a fresh interpreter for each")
    p.add_argument("-m", dest="module", action="store_true",
                   help="treat the target as a module name, like python -m")
    p.add_argument("script", help="the Python script (or module with -m) to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def _version() -> str:
    from . import __version__

    return f"minidist {__version__}"


def _exports(specs: list[str]) -> dict[str, str]:
    """mpirun's -x: VAR=VALUE sets it, VAR passes this environment's value on."""
    out = {}
    for spec in specs:
        name, eq, value = spec.partition("=")
        if not name:
            raise ValueError(f"-x {spec!r}: expected VAR or VAR=VALUE")
        if eq:
            out[name] = value
        elif name in os.environ:
            out[name] = os.environ[name]
    return out


def _run_env(a: argparse.Namespace) -> dict[str, str]:
    env = _exports(a.export)
    if a.algo_modules:
        env["MINIDIST_ALGO_MODULE"] = ",".join(
            [*filter(None, [os.environ.get("MINIDIST_ALGO_MODULE", "")]), *a.algo_modules])
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="minidist", description="minidist run -n N script.py [args...] starts a job; "
        "minidist bench COLLECTIVE -n N [--vs gloo|mpi] measures a collective; minidist "
        "calibrate measures this machine for the cost model; minidist trace merge DIR merges "
        "the traces MINIDIST_TRACE=DIR records; minidist info says which core runs.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    from .bench.cli import add_parser as _bench_parser

    _bench_parser(sub)
    cal = sub.add_parser("calibrate", help="measure this machine for the cost model",
                         description="Measure the cost per call, per message and per "
                         "byte of minidist's socket and shared-memory paths on this machine "
                         "(a job of 4 processes, a few seconds) and save them where every "
                         "job reads them (MINIDIST_CALIBRATION, default "
                         "~/.cache/minidist/calibration.json).")
    cal.add_argument("--quick", action="store_true", help="a rougher, faster measurement")
    cal.add_argument("--no-save", action="store_true", help="print only")
    from .algo_cli import add_parser as _algo_parser

    _algo_parser(sub)
    _trace_parser(sub)
    sub.add_parser("info", help="which core runs the shared-memory paths, and why",
                   description="Print the version, the core that runs the shared-memory "
                   "paths (compiled or pure) and why.")
    a = parser.parse_args(argv)
    if a.command == "info":
        from .shm import core

        print(_version())
        for k, v in core.info().items():
            print(f"{k}: {v}")
        return 0
    if a.command == "run":
        from .launcher import RunOptions, run

        try:
            if a.standalone:
                a.nnodes, a.node_rank, a.master_addr, a.master_port = 1, 0, "127.0.0.1", 0
            return run(RunOptions(nproc=a.nproc, target=a.script, args=a.args,
                                  module=a.module, start_method=a.start_method,
                                  nnodes=a.nnodes, node_rank=a.node_rank,
                                  master_addr=a.master_addr, master_port=a.master_port,
                                  grace=a.grace, prefix=not a.no_prefix,
                                  env=_run_env(a), log_dir=a.log_dir,
                                  restart_failed=a.restart_failed,
                                  secret_file=a.secret_file, verbose=a.verbose))
        except (OSError, ValueError) as e:  # a taken port, a bad option: one clear line
            print(f"minidist run: {e}", file=sys.stderr)
            return 1
    if a.command == "calibrate":
        return _calibrate(a)
    if a.command == "bench":
        from .bench.cli import run_bench

        return run_bench(a)
    if a.command == "algo":
        from .algo_cli import run as run_algo

        return run_algo(a)
    if a.command == "trace":
        return _trace(a)
    parser.error(f"unknown command {a.command}")
    return 2


def _trace_parser(sub) -> None:
    t = sub.add_parser("trace", help="traces of real runs (MINIDIST_TRACE)",
                       description="Work with the traces ranks write under MINIDIST_TRACE=DIR "
                       "(DIR/<job>-rank<R>.json).")
    tsub = t.add_subparsers(dest="trace_command", required=True)
    m = tsub.add_parser("merge", help="merge a job's rank files into one Chrome trace",
                        description="Merge the per-rank trace files in DIR into one Chrome / "
                        "Perfetto trace per job (DIR/<job>.json, or --out), timestamps "
                        "aligned on the job's first event. minidist run does this itself "
                        "when a job ends.")
    m.add_argument("dir", metavar="DIR", help="the MINIDIST_TRACE directory")
    m.add_argument("--out", default=None, metavar="FILE",
                   help="the merged file (one job only; default DIR/<job>.json)")
    m.add_argument("--job", default=None,
                   help="merge only this job's files (the <job> of <job>-rank<R>.json)")


def _trace(a: argparse.Namespace) -> int:
    from . import tracing

    try:
        for path in tracing.merge(a.dir, job=a.job, out=a.out):
            print(path)
    except (OSError, ValueError) as e:
        print(f"minidist trace merge: {e}", file=sys.stderr)
        return 1
    return 0


def _calibrate(a: argparse.Namespace) -> int:
    from . import calibrate
    from .algorithms import cost

    try:
        c = calibrate.measure(quick=a.quick)
    except RuntimeError as e:
        print(f"minidist {e}", file=sys.stderr)
        return 1
    for k, v in c.to_dict().items():
        print(f"{k:8s} {v:.3g}" if isinstance(v, float) else f"{k:8s} {v}")
    sizes = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
    print("all_reduce choice by size (bytes) and ranks:")
    print("ranks " + "".join(f"{s:>20d}" for s in sizes))
    for n in (2, 4, 8, 64):
        print(f"{n:5d} " + "".join(f"{cost.choose(n, s, c):>20s}" for s in sizes))
    if not a.no_save:
        print(f"saved to {calibrate.save(c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
