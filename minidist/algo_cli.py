"""``minidist algo``: list, check, draw, trace and cost collective algorithms.

An algorithm is named as a built-in or registered name (``ring``), or as
``module:function`` (the module imported from ``sys.path`` / ``PYTHONPATH``, then the
current directory). ``MINIDIST_ALGO_MODULE`` and ``--module`` load modules of
algorithms first, as every rank of a job does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import algorithms, collectives
from .algorithms import cost, draw, plugins, simulator, trace
from .bench.report import format_size, parse_size
from .env import algorithm_modules

EPILOG = """\
examples:
  minidist algo list
  minidist algo check all_reduce ring -n 1-64
  minidist algo check all_reduce mine:rabenseifner -n 1-32
  minidist algo show all_reduce ring -n 4 --count 8 --out ring.svg
  minidist algo trace all_reduce ring -n 8 --bytes 1M --out ring.json
  minidist algo cost all_reduce -n 8 --bytes 1M
  minidist algo cost all_reduce -n 16 --bytes 64M --nodes 2
"""

ITEMSIZE = {"float16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
            "int32": 4, "int64": 8}


class CliError(Exception):
    """A bad argument: one line on stderr, exit code 2."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "algo", help="list, check, draw, trace and cost collective algorithms (yours too)",
        description="Study collective algorithms: list them, check one in the simulator "
        "for many group sizes, draw it, trace a simulated call, or predict what every "
        "algorithm of a collective costs. ALGO is a name (built in or registered) or "
        "module:function.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--module", action="append", default=[], metavar="MODULE",
                        help="import MODULE and register its algorithms first "
                        "(repeatable; MINIDIST_ALGO_MODULE is read too)")
    s = p.add_subparsers(dest="algo_command", required=True)

    def add(name: str, **kw) -> argparse.ArgumentParser:
        return s.add_parser(name, parents=[common], **kw)

    ls = add("list", help="the algorithms of every collective")
    ls.add_argument("collective", nargs="?", choices=algorithms.COLLECTIVES)

    ck = add("check", help="verify an algorithm in the simulator",
                      description="Run the algorithm in the simulator for every group "
                      "size in -n, several counts and every root, against numpy. Exit 0 "
                      "when it holds everywhere, 1 with a report naming the first "
                      "failing size, count, root, rank and step.")
    _collective_algo(ck)
    ck.add_argument("-n", "--sizes", default="1-17",
                    help="group sizes: N, A-B, or a comma list (default 1-17)")
    ck.add_argument("--counts", default=None,
                    help="element counts to try (comma list; default 0, 1, n-1, n, n+1, "
                    "3n+2, 2n+11)")
    ck.add_argument("--roots", default="all",
                    help="roots of rooted collectives: all (default) or a comma list")
    ck.add_argument("--eager", action="store_true",
                    help="a Send completes at once (default: only once its Recv is "
                    "posted, which finds every deadlock)")
    ck.add_argument("--no-contract", action="store_true",
                    help="do not require reducing collectives to write out last")
    ck.add_argument("--no-bit-identical", action="store_true",
                    help="do not require all_reduce's ranks to agree bit for bit")

    sh = add("show", help="draw one call: ranks down, rounds across",
                      description="Draw every message of one call (.svg, or .png with "
                      "matplotlib) or list it as text (.txt, or --out - for stdout).")
    _collective_algo(sh)
    sh.add_argument("-n", "--nproc", type=int, required=True, help="ranks")
    sh.add_argument("--count", type=int, default=None,
                    help="elements (as the algorithm counts them; default 2n, 0 for barrier)")
    sh.add_argument("--root", type=int, default=0, help="root of rooted collectives")
    sh.add_argument("--nodes", default=None, help="node layout: K nodes, or a comma list")
    sh.add_argument("--title", default=None, help="the picture's title")
    sh.add_argument("-o", "--out", required=True, help="FILE.svg, FILE.png, FILE.txt or -")

    tr = add("trace", help="a Chrome/Perfetto trace of a simulated call",
                      description="Replay one call under the cost model and write it "
                      "as a Chrome/Perfetto trace (open it in ui.perfetto.dev).")
    _collective_algo(tr)
    tr.add_argument("-n", "--nproc", type=int, required=True, help="ranks")
    _size_options(tr)
    tr.add_argument("-o", "--out", required=True, help="FILE.json")

    co = add("cost", help="predicted time of every algorithm of a collective",
                      description="Replay every algorithm of a collective under the cost "
                      "model (the saved calibration, else the defaults) and compare each "
                      "with the lower bounds.")
    co.add_argument("collective", choices=algorithms.COLLECTIVES)
    co.add_argument("-n", "--nproc", type=int, required=True, help="ranks")
    _size_options(co)
    co.add_argument("--algorithm", action="append", default=[], metavar="ALGO",
                    help="also (or only, with --only) these algorithms: names or "
                    "module:function")
    co.add_argument("--only", action="store_true", help="only the --algorithm ones")
    co.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _collective_algo(p: argparse.ArgumentParser) -> None:
    p.add_argument("collective", choices=algorithms.COLLECTIVES)
    p.add_argument("algorithm", metavar="ALGO", help="a name or module:function")


def _size_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-b", "--bytes", default="1M",
                   help="bytes of the whole vector, K/M/G suffixes (default 1M)")
    p.add_argument("-d", "--dtype", choices=tuple(ITEMSIZE), default="float32")
    p.add_argument("--root", type=int, default=0, help="root of rooted collectives")
    p.add_argument("--nodes", default=None,
                   help="node layout: K (ranks split evenly, in order) or a comma list "
                   "of each rank's node")
    p.add_argument("--cores", type=int, default=None,
                   help="cores per node (default: the calibration's)")


# ----------------------------------------------------------------------------- parsing


def parse_sizes(text: str) -> list[int]:
    """``"1-64"``, ``"8"``, ``"1-17,32,64"`` -> sorted group sizes."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            lo, hi = int(a), int(b or a)
            if lo < 1 or hi < lo:
                raise ValueError
            out.update(range(lo, hi + 1))
    except ValueError:
        raise CliError(f"bad -n {text!r}: use N, A-B or a comma list of sizes >= 1") from None
    return sorted(out)


def parse_nodes(text: str | None, n: int) -> tuple[int, ...] | None:
    """``"2"`` -> n ranks in 2 nodes (in order); ``"0,0,1,1"`` as given; None for one."""
    if text is None:
        return None
    try:
        if "," not in text:
            k = int(text)
            if not 1 <= k <= n:
                raise ValueError
            per = -(-n // k)
            return tuple(r // per for r in range(n))
        layout = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise CliError(f"bad --nodes {text!r}: a number of nodes (1..{n}) or a comma "
                       "list of each rank's node") from None
    if len(layout) != n or min(layout) < 0:
        raise CliError(f"--nodes lists {len(layout)} nodes for {n} ranks")
    return layout


def load(modules: list[str]) -> None:
    """Import MINIDIST_ALGO_MODULE's modules and ``modules``."""
    try:
        plugins.load_modules([*algorithm_modules(os.environ), *modules])
    except (ImportError, ValueError) as e:
        raise CliError(str(e)) from e


def resolve(collective: str, spec: str) -> str:
    try:
        return plugins.resolve(collective, spec)
    except (ImportError, ValueError) as e:
        raise CliError(str(e)) from e


def count_of(collective: str, nbytes: int, n: int, itemsize: int) -> int:
    """``--bytes`` (the whole vector) as the algorithms count elements."""
    if collective == "barrier":
        return 0
    elements = max(1, nbytes // itemsize)
    if collectives.get(collective).in_place:
        return elements
    return max(1, elements // n)  # one block


def whole_bytes(collective: str, count: int, n: int, itemsize: int) -> int:
    """The whole vector's bytes for a count as the algorithms count elements."""
    return collectives.get(collective).whole_bytes(n, count, itemsize)


def costs_for(cores: int | None) -> tuple[cost.Costs, str]:
    """The saved calibration (or the defaults), and where it came from."""
    import dataclasses

    from . import calibrate

    c = calibrate.load()
    where = str(calibrate.path()) if calibrate.path().exists() and c != cost.DEFAULT \
        else "the built-in defaults"
    if cores is not None:
        if cores < 1:
            raise CliError("--cores must be at least 1")
        c = dataclasses.replace(c, cores=cores)
    return c, where


def minidist_choice(collective: str, n: int, count: int, dtype: str, c: cost.Costs,
                    nodes: tuple[int, ...] | None = None) -> str | None:
    """The algorithm a job's planner would pick for this call (rank 0 as the root), or
    None for a group of one. ``count`` as the algorithms count elements."""
    import numpy as np

    from . import segments
    from .env import shared_memory_allowed
    from .ops import ReduceOp
    from .plan import Planner

    if n < 2:
        return None
    planner = Planner(0, n, lambda g: 0, lambda g, peer, tag, sending: 0,
                      segments.available() and shared_memory_allowed(os.environ), c, {})
    if nodes is not None:
        planner.set_nodes(list(nodes))
    dt = np.dtype(dtype)

    def a(k: int) -> np.ndarray:
        return np.empty(k, dt)  # never touched: no memory is used

    blocks = n * count
    prepare = {
        "all_reduce": lambda: planner.prepare_all_reduce(a(count), ReduceOp.SUM, None, None),
        "broadcast": lambda: planner.prepare_broadcast(a(count), 0, None, None),
        "reduce": lambda: planner.prepare_reduce(a(count), 0, ReduceOp.SUM, None, None),
        "all_gather": lambda: planner.prepare_all_gather(a(blocks), a(count), None, None),
        "reduce_scatter": lambda: planner.prepare_reduce_scatter(a(count), a(blocks),
                                                                 ReduceOp.SUM, None, None),
        "gather": lambda: planner.prepare_gather(a(count), a(blocks), 0, None, None),
        "scatter": lambda: planner.prepare_scatter(a(count), a(blocks), 0, None, None),
        "all_to_all": lambda: planner.prepare_all_to_all(a(blocks), a(blocks), None, None),
        "barrier": lambda: planner.prepare_barrier(None),
    }[collective]
    prepared = prepare()
    return prepared.call.algorithm_name if prepared.call is not None else None


# ----------------------------------------------------------------------------- commands


def run(a: argparse.Namespace) -> int:
    try:
        load(a.module)
        return {"list": _list, "check": _check, "show": _show, "trace": _trace,
                "cost": _cost}[a.algo_command](a)
    except CliError as e:
        print(f"minidist algo: error: {e}", file=sys.stderr)
        return 2


def _list(a: argparse.Namespace) -> int:
    mine = algorithms.registered()
    for c in [a.collective] if a.collective else algorithms.COLLECTIVES:
        print(f"{c}:")
        for name in algorithms.ALGORITHMS[c]:
            index = algorithms.wire_index(c, name)
            where = f"registered, {mine[c][name]}" if name in mine[c] else "built in"
            print(f"  {name:22s} {where} (wire index {index})")
    return 0


def _check(a: argparse.Namespace) -> int:
    name = resolve(a.collective, a.algorithm)
    sizes = parse_sizes(a.sizes)
    counts = None
    if a.counts:
        try:
            counts = [int(x) for x in a.counts.split(",")]
        except ValueError:
            raise CliError(f"bad --counts {a.counts!r}: a comma list of counts") from None
    roots: object = None
    if a.roots != "all":
        try:
            roots = [int(x) for x in a.roots.split(",")]
        except ValueError:
            raise CliError(f"bad --roots {a.roots!r}: all, or a comma list") from None
    report = simulator.verify(a.collective, name, sizes, counts, roots,
                              rendezvous=not a.eager, contract=not a.no_contract,
                              bit_identical=not a.no_bit_identical)
    print(report)
    return 0 if report.ok else 1


def _schedules(a: argparse.Namespace, name: str, count: int,
               nodes: tuple[int, ...] | None, itemsize: int = 4):
    if a.nproc < 1:
        raise CliError("-n must be at least 1")
    if not 0 <= a.root < a.nproc:
        raise CliError(f"--root {a.root} is outside 0..{a.nproc - 1}")
    try:
        return algorithms.schedules(a.collective, name, a.nproc, count, a.root, nodes=nodes,
                                    itemsize=itemsize)
    except ValueError as e:
        raise CliError(str(e)) from e


def _show(a: argparse.Namespace) -> int:
    name = resolve(a.collective, a.algorithm)
    n = a.nproc
    count = (0 if a.collective == "barrier" else 2 * n) if a.count is None else a.count
    nodes = parse_nodes(a.nodes, n)
    scheds = _schedules(a, name, count, nodes)
    out = a.out
    suffix = Path(out).suffix.lower() if out != "-" else ".txt"
    if suffix not in (".svg", ".png", ".txt"):
        raise CliError(f"--out {out!r}: write .svg, .png or .txt (or - for text)")
    try:
        if suffix == ".txt":
            text = draw.to_text(scheds)
            if out == "-":
                sys.stdout.write(text)
                return 0
            Path(out).write_text(text)
        else:
            pic = draw.layout(scheds, a.title)
            if suffix == ".svg":
                Path(out).write_text(draw.to_svg(pic))
            else:
                _png(pic, out)
    except ValueError as e:  # messages that are never received
        raise CliError(f"{a.collective}/{name}: {e}") from e
    print(f"wrote {out}")
    return 0


def _png(pic: draw.Picture, path: str) -> None:
    """Render a picture with matplotlib (the ``bench`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import FancyArrowPatch, Polygon
        from matplotlib.path import Path as MPath
    except ImportError:
        raise CliError(".png needs matplotlib (pip install matplotlib, or the 'bench' "
                       "extra); .svg needs nothing") from None
    dpi = 100
    fig = plt.figure(figsize=(pic.width / dpi, pic.height / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, pic.width)
    ax.set_ylim(pic.height, 0)
    ax.axis("off")
    for x1, y1, x2, y2, colour in pic.lines:
        ax.plot([x1, x2], [y1, y2], color=colour, lw=3 if colour != "#e3e3e3" else 1)
    for arr in pic.arrows:
        (cx, cy), (ex, ey), tri = draw.arrow_path(arr)
        curve = MPath([(arr.x1, arr.y1), (cx, cy), (ex, ey)],
                      [MPath.MOVETO, MPath.CURVE3, MPath.CURVE3])
        ax.add_patch(FancyArrowPatch(path=curve, arrowstyle="-", color=arr.color, lw=1.4,
                                     linestyle="--" if arr.dashed else "-"))
        ax.add_patch(Polygon(tri, closed=True, color=arr.color))
        if arr.label:
            _, _, lx, ly = draw.curve(arr)
            left = arr.bend < 0
            ax.text(lx - 3 if left else lx + 3, ly - 3, arr.label, fontsize=6.5,
                    color=arr.color, ha="right" if left else "left",
                    bbox={"facecolor": "white", "alpha": 0.85, "lw": 0, "pad": 0.5})
    for x, y, fill, mark in pic.dots:
        ax.plot([x], [y], "o", ms=6, mfc=fill, mec="#333333")
        if mark:
            ax.text(x - 12, y - 6, mark, fontsize=9, fontweight="bold", color="#333333")
    for x, y, text, size, anchor, colour in pic.texts:
        ha = {"start": "left", "middle": "center", "end": "right"}[anchor]
        ax.text(x, y, text, fontsize=size * 0.75, ha=ha, va="baseline", color=colour)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _trace(a: argparse.Namespace) -> int:
    name = resolve(a.collective, a.algorithm)
    itemsize = ITEMSIZE[a.dtype]
    nbytes = _bytes(a.bytes)
    count = count_of(a.collective, nbytes, a.nproc, itemsize)
    nodes = parse_nodes(a.nodes, a.nproc)
    c, _ = costs_for(a.cores)
    scheds = _schedules(a, name, count, nodes, itemsize)
    try:
        rep = cost.replay(scheds, c, itemsize, nodes, record=True)
    except ValueError as e:
        raise CliError(f"{a.collective}/{name}: {e}") from e
    title = (f"{a.collective}/{name} n={a.nproc} "
             f"{format_size(whole_bytes(a.collective, count, a.nproc, itemsize))}B")
    with open(a.out, "w") as f:
        json.dump(trace.chrome_trace(rep, title=title, nodes=nodes, costs=c), f)
    print(f"wrote {a.out}: {len(rep.events)} slices, {rep.messages} messages, predicted "
          f"{rep.time * 1e6:.1f} us (open it in https://ui.perfetto.dev)")
    return 0


def _bytes(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise CliError(str(e)) from e


def _cost(a: argparse.Namespace) -> int:
    n, coll = a.nproc, a.collective
    if n < 1:
        raise CliError("-n must be at least 1")
    itemsize = ITEMSIZE[a.dtype]
    count = count_of(coll, _bytes(a.bytes), n, itemsize)
    nbytes = whole_bytes(coll, count, n, itemsize)
    nodes = parse_nodes(a.nodes, n)
    c, where = costs_for(a.cores)
    asked = [resolve(coll, spec) for spec in a.algorithm]  # may load modules
    names = [] if a.only else list(algorithms.ALGORITHMS[coll])
    names += [name for name in asked if name not in names]
    if not names:
        raise CliError("--only needs at least one --algorithm")
    bounds = cost.lower_bounds(coll, n, nbytes, c)
    rows = []
    for name in names:
        row: dict[str, object] = {"algorithm": name}
        if name == "shared_memory" and nodes is not None and len(set(nodes)) > 1:
            row["error"] = "shared memory needs every rank on one node"
            rows.append(row)
            continue
        try:
            scheds = algorithms.schedules(coll, name, n, count, a.root, nodes=nodes,
                                          itemsize=itemsize)
            rep = cost.replay(scheds, c, itemsize, nodes)
        except ValueError as e:
            row["error"] = str(e).splitlines()[0]
            rows.append(row)
            continue
        rounds = max((algorithms.stats(s)["rounds"] for s in scheds), default=0)
        row.update(seconds=rep.time, messages=rep.messages, bytes_sent=rep.nbytes,
                   rounds=rounds,
                   percent_of_bound=100 * bounds["bound"] / rep.time if rep.time else None)
        rows.append(row)
    choice = minidist_choice(coll, n, count, a.dtype, c, nodes)
    if a.json:
        print(json.dumps({"collective": coll, "n": n, "bytes": nbytes, "count": count,
                          "dtype": a.dtype, "nodes": nodes, "costs": c.to_dict(),
                          "costs_from": where, "bounds": bounds, "algorithms": rows,
                          "minidist_chooses": choice}, indent=2))
        return 0
    layout = "1 node" if nodes is None or len(set(nodes)) == 1 else f"{len(set(nodes))} nodes"
    print(f"{coll}: n={n}, {format_size(nbytes)}B ({count} {a.dtype} "
          f"{'elements' if collectives.get(coll).in_place else 'per block'}), {layout}, "
          f"{c.cores} cores per node")
    print(f"costs ({where}): call_s {c.call_s * 1e6:.3g} us, alpha_s {c.alpha_s * 1e6:.3g} "
          f"us, beta_s {c.beta_s * 1e9:.3g} ns/B, gamma {c.gamma * 1e9:.3g} ns/B, delta "
          f"{c.delta * 1e9:.3g} ns/B, sigma {c.sigma * 1e6:.3g} us"
          + (f", alpha_n {c.alpha_n * 1e6:.3g} us, beta_n {c.beta_n * 1e9:.3g} ns/B"
             if layout != "1 node" else ""))
    print("lower bounds (a core per rank):")
    print(f"  latency    ceil(log2 n) * alpha_s          {bounds['latency'] * 1e6:12.1f} us")
    bw = {"all_reduce": "2(n-1)/n * N * beta_s", "broadcast": "N/2 * beta_s",
          "reduce": "N/2 * beta_s", "gather": "(n-1)/n * N/2 * beta_s",
          "scatter": "(n-1)/n * N/2 * beta_s", "barrier": "0"}.get(
        coll, "(n-1)/n * N * beta_s")
    print(f"  bandwidth  {bw:32s} {bounds['bandwidth'] * 1e6:12.1f} us")
    if bounds["compute"]:
        print(f"  compute    (n-1)/n * N * gamma              {bounds['compute'] * 1e6:12.1f} us")
    if bounds["call"]:
        print(f"  call       call_s                           {bounds['call'] * 1e6:12.1f} us")
    print(f"  bound      call + max(latency, bandwidth + compute) "
          f"{bounds['bound'] * 1e6:5.1f} us")
    print()
    print(f"{'algorithm':22s} {'predicted':>12s} {'% of bound':>11s} {'messages':>9s} "
          f"{'rounds':>7s} {'bytes sent':>12s}")
    for row in rows:
        if "error" in row:
            print(f"{row['algorithm']:22s} cannot run here: {row['error']}")
            continue
        pct = row["percent_of_bound"]
        mark = "  <- minidist's choice" if row["algorithm"] == choice else ""
        print(f"{row['algorithm']:22s} {row['seconds'] * 1e6:9.1f} us "
              f"{'-' if pct is None else f'{pct:.0f}%':>11s} {row['messages']:9d} "
              f"{row['rounds']:7d} {row['bytes_sent']:12d}{mark}")
    if choice is not None and choice not in names:
        print(f"minidist chooses {choice}")
    if "shared_memory" in names and layout == "1 node":
        print("(the bandwidth bound is for messages; shared memory moves the data with "
              "copies, at delta per byte)")
    return 0
