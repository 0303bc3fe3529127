"""The ``minidist`` command line: ``minidist run -n N script.py [args...]``."""

from __future__ import annotations

import argparse
import os
import sys


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="launch N processes of a script on this node",
                       description="Launch N processes of a Python script (or -m module) "
                       "with minidist's environment set; relay their output prefixed with "
                       "the rank; exit with the first failing rank's code.")
    p.add_argument("-n", "--nproc-per-node", "--nproc", dest="nproc", type=int, default=1,
                   help="processes on this node (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index")
    p.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                   help="address of node 0 (default 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=int(os.environ.get("MINIDIST_PORT", 0)),
                   help="minidist's TCP port on node 0 (default: MINIDIST_PORT or any free)")
    p.add_argument("--grace", type=float, default=5.0,
                   help="seconds the other ranks get to report after one fails (default 5)")
    p.add_argument("--no-prefix", action="store_true", help="do not prefix output lines")
    p.add_argument("--start-method", choices=("fork", "spawn"),
                   default=os.environ.get("MINIDIST_START_METHOD", "fork"),
                   help="fork the ranks from a launcher that has imported numpy and "
                   "minidist (default), or spawn a fresh interpreter for each")
    p.add_argument("-m", dest="module", action="store_true",
                   help="treat the target as a module name, like python -m")
    p.add_argument("script", help="the Python script (or module with -m) to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minidist", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    a = parser.parse_args(argv)
    if a.command == "run":
        from .launcher import RunOptions, run

        return run(RunOptions(nproc=a.nproc, target=a.script, args=a.args, module=a.module,
                              start_method=a.start_method, nnodes=a.nnodes,
                              node_rank=a.node_rank, master_addr=a.master_addr,
                              master_port=a.master_port, grace=a.grace,
                              prefix=not a.no_prefix))
    parser.error(f"unknown command {a.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
