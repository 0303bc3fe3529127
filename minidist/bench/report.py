"""The pure parts of ``minidist bench``: sizes, counts, bandwidths, the table, JSON, plot.

Conventions are those of nccl-tests, so that the numbers read the same way:

* ``size`` is the bytes of the collective's whole vector: the buffer of all_reduce and
  broadcast, the gathered output of all_gather, the input of reduce_scatter and of
  all_to_all (so a rank of all_gather sends, and one of reduce_scatter receives,
  ``size / n`` bytes; one of all_to_all sends ``size / n`` to each rank).
* ``algbw = size / time`` and ``busbw = algbw * factor``, in GB/s (10^9 bytes), with
  factor ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter and
  all_to_all and 1 for broadcast. busbw is comparable across n: it is what each rank's link carried.
* ``time`` is the mean time of one iteration on a rank, the largest over the ranks.
* ``pingpong`` is point-to-point: each even rank sends ``size`` bytes to the next odd
  rank, which sends them back; ``time`` is one round trip and busbw = algbw x 2 (two
  messages of ``size`` per round trip).

The ratio column ``x SYSTEM`` is ``SYSTEM time / minidist time``. For the same size and
n this is also ``minidist busbw / SYSTEM busbw`` (the factor and the size cancel), so one
column serves latency-bound and bandwidth-bound sizes alike: above 1, minidist is faster.

With ``rounds`` above 1 every system runs once per round, in turn, and a system's time
is the median over the rounds; the ratio is the median of the ratios within a round
(the runs of one round are seconds apart, so a shared machine's slow spells, which last
longer, weigh on both sides of a ratio alike).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import collectives

GENERATED = tuple(c.name for c in collectives.front_ends())  # minidist only (scan, ...)
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
               "barrier", "pingpong", *GENERATED)
SYSTEMS = ("minidist", "gloo", "mpi")
# dtypes that numpy, torch (gloo) and MPI all carry
DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64")
ITEMSIZE = {"float16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
            "int32": 4, "int64": 8}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes from ``"64M"``, ``"1K"``, ``"8"``, ``"1.5G"``, ``"4KiB"``, ``"16MB"``.

    Suffixes are binary, as in nccl-tests: K = 1024, M = 1024^2, G = 1024^3 (T too);
    an optional ``B`` or ``iB`` may follow. ValueError for anything else, for a negative
    size, or for a fraction that is not a whole number of bytes.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use a number of bytes with an optional "
                         "K, M or G suffix, e.g. 8, 1K, 64M)")
    number, unit = m.group(1), m.group(2).lower()
    scale = _UNITS[unit]
    if "." in number:
        value = float(number) * scale
        if value != int(value):
            raise ValueError(f"{text!r} is not a whole number of bytes")
        return int(value)
    return int(number) * scale


def format_size(nbytes: int) -> str:
    """``67108864`` -> ``"64M"``; sizes that are not whole K/M/G stay in bytes."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def size_sweep(min_bytes: int, max_bytes: int, factor: float = 2.0) -> list[int]:
    """min, min*factor, ... up to and including max (like nccl-tests' ``-b -e -f``)."""
    if min_bytes < 0 or max_bytes < 0:
        raise ValueError("sizes cannot be negative")
    if max_bytes < min_bytes:
        raise ValueError(f"--max-bytes ({max_bytes}) is smaller than --min-bytes "
                         f"({min_bytes})")
    if min_bytes == max_bytes:
        return [min_bytes]
    if not factor > 1:
        raise ValueError(f"--factor must be greater than 1, not {factor}")
    if min_bytes == 0:
        raise ValueError("--min-bytes must be at least 1 for a sweep")
    sizes, size = [], float(min_bytes)
    while size <= max_bytes * (1 + 1e-12):
        sizes.append(int(round(size)))
        size *= factor
    return sizes


def element_count(collective: str, nbytes: int, n: int, itemsize: int) -> int:
    """Elements of the whole vector for a requested size (see the module docstring).

    At least one element (one per rank for all_gather and reduce_scatter, whose vector
    is ``n`` equal blocks, so it is rounded down to a multiple of ``n``).
    """
    count = nbytes // itemsize
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return max(1, count // n) * n
    if collective == "barrier":
        return 0
    return max(1, count)


def element_counts(collective: str, sizes: Iterable[int], n: int, itemsize: int) -> list[int]:
    """The distinct element counts of a sweep, in order (rounding may merge sizes)."""
    if collective == "barrier":
        return [0]
    out: list[int] = []
    for s in sizes:
        c = element_count(collective, s, n, itemsize)
        if c not in out:
            out.append(c)
    return out


def bus_factor(collective: str, n: int) -> float | None:
    """busbw / algbw for ``n`` ranks (nccl-tests' factors); None for barrier."""
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    if collective == "pingpong":
        return 2.0
    if collective == "barrier":
        return None
    if collective in GENERATED:  # every rank receives (at most) one vector
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def bandwidths(collective: str, n: int, nbytes: int, time_us: float
               ) -> tuple[float | None, float | None]:
    """(algbw, busbw) in GB/s for one size; (None, None) for barrier or a zero time."""
    factor = bus_factor(collective, n)
    if factor is None or not time_us or time_us <= 0:
        return None, None
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * factor


# ----------------------------------------------------------------------------- results


@dataclass
class Measurement:
    """One system at one size: the max over ranks of the mean iteration time."""

    time_us: float
    wrong: int | None = None  # elements wrong after a checked call (None: not checked)


@dataclass
class Results:
    """What one invocation measured: every system, every size."""

    collective: str
    n: int
    dtype: str
    counts: list[int]
    iters: int
    warmup: int
    algorithm: str | None = None
    check: bool = False
    systems: list[str] = field(default_factory=lambda: ["minidist"])
    # system -> element count -> measurement
    data: dict[str, dict[int, Measurement]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    info: dict[str, dict[str, Any]] = field(default_factory=dict)  # system -> details
    # --predict: algorithm -> element count -> predicted time (us), and minidist's choice
    predicted: dict[str, dict[int, float]] = field(default_factory=dict)
    chosen: dict[int, str] = field(default_factory=dict)
    # counts at which a call without algorithm= takes the fast path (shared slots)
    fast: list[int] = field(default_factory=list)
    rounds: int = 1
    # rounds > 1: system -> element count -> that size's time in each round (us)
    round_times: dict[str, dict[int, list[float]]] = field(default_factory=dict)

    def add_round(self, system: str, measured: Mapping[int, Measurement]) -> None:
        """One round's measurements of ``system``: ``data`` becomes, per size, the median
        time over the rounds so far (and the most wrong elements of any round)."""
        per = self.round_times.setdefault(system, {})
        for count, m in measured.items():
            per.setdefault(count, []).append(m.time_us)
            old = self.data.get(system, {}).get(count)
            wrong = m.wrong if old is None or old.wrong is None else (
                old.wrong if m.wrong is None else max(old.wrong, m.wrong))
            time_us = statistics.median(per[count])
            self.data.setdefault(system, {})[count] = Measurement(time_us, wrong)

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    def nbytes(self, count: int) -> int:
        return count * self.itemsize

    def get(self, system: str, count: int) -> Measurement | None:
        return self.data.get(system, {}).get(count)

    def ratio(self, system: str, count: int) -> float | None:
        """``system`` time / minidist time (= minidist busbw / ``system`` busbw); with
        several minidist algorithms, the fastest one's time; over several rounds, the
        median of the ratios within a round."""
        theirs = self.round_times.get(system, {}).get(count, [])
        ours = self.round_times.get("minidist", {}).get(count, [])
        if len(theirs) > 1 and len(ours) == len(theirs) and all(t > 0 for t in ours):
            return statistics.median([t / m for t, m in zip(theirs, ours)])
        other = self.get(system, count)
        mine = self.get("minidist", count)
        if mine is None:
            times = [m for s in self.minidist_columns if (m := self.get(s, count))]
            mine = min(times, key=lambda m: m.time_us) if times else None
        if mine is None or other is None or mine.time_us <= 0:
            return None
        return other.time_us / mine.time_us

    @property
    def minidist_columns(self) -> list[str]:
        """The systems that are minidist: "minidist", or "minidist/ALGO" per algorithm."""
        return [s for s in self.systems if s == "minidist" or s.startswith("minidist/")]

    @property
    def others(self) -> list[str]:
        return [s for s in self.systems if s not in self.minidist_columns]

    def algorithm_of(self, system: str) -> str:
        """The algorithm a minidist column ran ("auto": minidist's choice)."""
        if system.startswith("minidist/"):
            return system.split("/", 1)[1]
        return self.algorithm or "auto"

    def wrong_total(self) -> int:
        return sum(m.wrong or 0 for per in self.data.values() for m in per.values())


# ----------------------------------------------------------------------------- table


def _num(value: float | None, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _time(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 1e5 else f"{value:.0f}"


def header_lines(r: Results) -> list[str]:
    """The ``#`` lines above the table: what ran, where, and how to read it."""
    vs = f"  vs {', '.join(r.others)}" if r.others else ""
    alg = r.algorithm or "auto"
    rounds = f"  rounds={r.rounds}" if r.rounds > 1 else ""
    lines = [f"# minidist bench {r.collective}  n={r.n}  dtype={r.dtype}  iters={r.iters}  "
             f"warmup={r.warmup}  algorithm={alg}  check={'on' if r.check else 'off'}"
             f"{rounds}{vs}"]
    if r.machine:
        lines.append("# machine: " + machine_line(r.machine))
    factor = {"all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n",
              "all_to_all": "(n-1)/n", "broadcast": "1", "pingpong": "2"}.get(r.collective)
    if r.collective == "pingpong":
        lines.append("# time: max over ranks of the mean round trip (even rank -> next odd "
                     "rank -> back); algbw = size/time; busbw = algbw x 2")
    elif factor:
        lines.append(f"# time: max over ranks of the mean per-iteration time; "
                     f"algbw = size/time; busbw = algbw x {factor}")
    else:
        lines.append("# time: max over ranks of the mean time of one barrier")
    if r.rounds > 1:
        lines.append(f"# {r.rounds} rounds, the systems in turn in each: a time is the median "
                     "over the rounds, a ratio the median of the ratios within a round")
    for s in r.others:
        same = f" (= minidist busbw / {s} busbw)" if factor else ""
        lines.append(f"# x {s} = {s} time / minidist time{same}; > 1: minidist is faster")
    return lines


def table_lines(r: Results) -> list[str]:
    """The nccl-tests style table (no ``#`` header), one row per size."""
    check = r.check
    if r.collective == "barrier":
        cols = [(s, "time(us)") for s in r.systems]
        heads1 = [f"{s:>12}" for s in r.systems] + [f"{'x ' + s:>10}" for s in r.others]
        heads2 = [f"{'time(us)':>12}" for _ in r.systems]
        lines = ["#" + "".join(heads1)[1:], "#" + "".join(heads2)[1:]]
        row = [f"{_time(m.time_us if (m := r.get(s, 0)) else None):>12}" for s, _ in cols]
        row += [f"{_num(r.ratio(s, 0), 2):>10}" for s in r.others]
        lines.append("".join(row))
        return lines

    sys_w = 34 if not check else 41
    h1 = f"{'':>12}{'':>12}{'':>9}" + "".join(f"{s:^{sys_w}}" for s in r.systems)
    h1 += "".join(f"{'':>10}" for _ in r.others)
    cells = f"{'time':>12}{'algbw':>11}{'busbw':>11}" + (f"{'#wrong':>7}" if check else "")
    units = f"{'(us)':>12}{'(GB/s)':>11}{'(GB/s)':>11}" + (f"{'':>7}" if check else "")
    h2 = f"{'size':>12}{'count':>12}{'type':>9}" + cells * len(r.systems)
    h2 += "".join(f"{'x ' + s:>10}" for s in r.others)
    h3 = f"{'(B)':>12}{'(elements)':>12}{'':>9}" + units * len(r.systems)
    h3 += "".join(f"{'':>10}" for _ in r.others)
    lines = ["#" + h1.rstrip()[1:], "#" + h2[1:], "#" + h3.rstrip()[1:]]
    for count in r.counts:
        nbytes = r.nbytes(count)
        row = f"{nbytes:>12}{count:>12}{r.dtype:>9}"
        for s in r.systems:
            m = r.get(s, count)
            if m is None:
                row += f"{'-':>12}{'-':>11}{'-':>11}" + (f"{'-':>7}" if check else "")
                continue
            algbw, busbw = bandwidths(r.collective, r.n, nbytes, m.time_us)
            row += f"{_time(m.time_us):>12}{_num(algbw, 3):>11}{_num(busbw, 3):>11}"
            if check:
                row += f"{'-' if m.wrong is None else m.wrong:>7}"
        row += "".join(f"{_num(r.ratio(s, count), 2):>10}" for s in r.others)
        lines.append(row)
    return lines


def footer_lines(r: Results) -> list[str]:
    """Average busbw per system over the sizes it ran, and any failure."""
    lines = []
    if r.collective != "barrier":
        avgs = []
        for s in r.systems:
            bws = [bandwidths(r.collective, r.n, r.nbytes(c), m.time_us)[1]
                   for c in r.counts if (m := r.get(s, c))]
            bws = [b for b in bws if b is not None]
            if bws:
                avgs.append(f"{s} {sum(bws) / len(bws):.3f} GB/s")
        if avgs:
            lines.append("# Avg bus bandwidth: " + ", ".join(avgs))
    if r.check and r.collective != "barrier":
        lines.append(f"# Out of bounds values: {r.wrong_total()} "
                     f"{'OK' if r.wrong_total() == 0 else 'FAILED'}")
    for s, err in r.errors.items():
        lines.append(f"# {s} FAILED: {err}")
    return lines


def algorithm_lines(r: Results) -> list[str]:
    """The table of several minidist algorithms (or one, with --predict): each one's
    measured and predicted time per size, minidist's choice, and the fastest."""
    cols = r.minidist_columns
    names = [r.algorithm_of(s) for s in cols]
    w = max([21, *(len(a) + 1 for a in names)])
    h1 = f"{'':>12}{'':>12}{'':>9}" + "".join(f"{a:>{w}}" for a in names)
    h2 = f"{'size':>12}{'count':>12}{'type':>9}" + f"{'time':>11}{'pred':>10}".rjust(w) * len(cols)
    h3 = f"{'(B)':>12}{'(elements)':>12}{'':>9}" + f"{'(us)':>11}{'(us)':>10}".rjust(w) * len(cols)
    if r.chosen:
        h1 += f"  {'':20s}"
        h2 += f"  {'minidist chooses':20s}"
        h3 += f"  {'':20s}"
    h2 += f"  {'fastest measured':20s}"
    if choice_ratios(r):
        h2 += f"{'chosen/fastest':>15s}"
    lines = ["#" + h1.rstrip()[1:], "#" + h2[1:].rstrip(), "#" + h3.rstrip()[1:]]
    for count in r.counts:
        row = f"{r.nbytes(count):>12}{count:>12}{r.dtype:>9}"
        measured = {}
        for s, a in zip(cols, names):
            m = r.get(s, count)
            pred = r.predicted.get(a, {}).get(count)
            if a == "auto" and pred is None and count in r.chosen:
                pred = r.predicted.get(r.chosen[count], {}).get(count)
            if m is not None:
                measured[a] = m.time_us
            cell = f"{_time(m.time_us if m else None):>11}{_time(pred):>10}"
            row += cell.rjust(w)
        if r.chosen:
            mark = "*" if count in r.fast else ""
            row += f"  {r.chosen.get(count, '-') + mark:20s}"
        best = min(measured, key=measured.get) if measured else "-"
        row += f"  {best:20s}"
        ratio = choice_ratios(r).get(count)
        if ratio is not None:
            row += f"{ratio:>15.2f}"
        lines.append(row.rstrip())
    return lines


CHOICE_TOLERANCE = 1.2
"""The choice summary counts the sizes at which minidist's choice measured within this
factor of the fastest algorithm measured."""


def choice_ratios(r: Results) -> dict[int, float]:
    """Per element count: the measured time of minidist's choice over the fastest
    measured algorithm's (only where the choice was measured, as a column of its own)."""
    names = {r.algorithm_of(s): s for s in r.minidist_columns}
    out = {}
    for count, chosen in r.chosen.items():
        times = {a: m.time_us for a, s in names.items() if (m := r.get(s, count))}
        if chosen in times and times and min(times.values()) > 0:
            out[count] = times[chosen] / min(times.values())
    return out


def choice_lines(r: Results) -> list[str]:
    """The summary under an algorithms table: how often the choice was (nearly) the
    fastest, and the sizes where a call would not run the chosen algorithm at all."""
    lines = []
    ratios = choice_ratios(r)
    if ratios:
        good = sum(1 for x in ratios.values() if x <= CHOICE_TOLERANCE)
        lines.append(f"# minidist's choice measured within {CHOICE_TOLERANCE:g}x of the "
                     f"fastest at {good} of {len(ratios)} sizes")
    if r.fast and r.chosen:
        lines.append("# *: without algorithm=, a call this small goes through the shared "
                     "slots (the fast path), not through the chosen algorithm; the choice "
                     "applies with MINIDIST_FASTPATH=0")
    return lines


def format_table(r: Results) -> str:
    """Header, table and footer, as ``minidist bench`` prints them."""
    by_algorithm = (len(r.minidist_columns) > 1 or bool(r.predicted)) \
        and r.collective != "barrier"
    table = algorithm_lines(r) if by_algorithm else table_lines(r)
    extra = []
    if r.predicted:
        extra = ["# pred: the cost model's replay of the algorithm's schedules with this "
                 "machine's calibration (minidist calibrate), all ranks on this node"]
    if len(r.minidist_columns) > 1 and r.others:
        extra.append("# x SYSTEM compares with the fastest minidist algorithm at each size")
    summary = choice_lines(r) if by_algorithm else []
    return "\n".join([*header_lines(r), *extra, "#", *table, "#", *summary,
                      *footer_lines(r)]) + "\n"


def machine_line(m: Mapping[str, Any]) -> str:
    parts = []
    if m.get("minidist"):
        parts.append(f"minidist {m['minidist']}")
    if m.get("cpus"):
        parts.append(f"{m['cpus']} cpus" + (f" ({m['cpu_model']})" if m.get("cpu_model") else ""))
    if m.get("mem_gib"):
        parts.append(f"{m['mem_gib']:.1f} GiB")
    if m.get("os"):
        parts.append(m["os"])
    for key in ("python", "numpy", "torch", "uvloop", "mpi4py", "mpi"):
        if key in m:
            parts.append(f"{key} {m[key] if m[key] else 'not installed'}")
    if m.get("load_before"):  # (the load after counts the benchmark's own processes)
        parts.append(f"load average before {' '.join(f'{x:.2f}' for x in m['load_before'])}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------- JSON


def to_json(r: Results) -> dict[str, Any]:
    """A JSON-ready document with every measurement and the derived figures."""
    rows = []
    for count in r.counts:
        nbytes = r.nbytes(count)
        row: dict[str, Any] = {"size": nbytes, "count": count, "results": {}, "ratio": {}}
        for s in r.systems:
            m = r.get(s, count)
            if m is None:
                continue
            algbw, busbw = bandwidths(r.collective, r.n, nbytes, m.time_us)
            row["results"][s] = {"time_us": m.time_us, "algbw_gbs": algbw, "busbw_gbs": busbw,
                                 "wrong": m.wrong}
            if r.rounds > 1 and count in r.round_times.get(s, {}):
                row["results"][s]["rounds_us"] = r.round_times[s][count]
        for s in r.others:
            row["ratio"][s] = r.ratio(s, count)
        rows.append(row)
    return {
        "collective": r.collective, "n": r.n, "dtype": r.dtype, "iters": r.iters,
        "warmup": r.warmup, "algorithm": r.algorithm, "check": r.check,
        "bus_factor": bus_factor(r.collective, r.n), "systems": r.systems,
        "machine": r.machine, "system_info": r.info, "rows": rows, "errors": r.errors,
        "predicted_us": {a: {str(c): t for c, t in per.items()}
                         for a, per in r.predicted.items()},
        "chosen": {str(c): a for c, a in r.chosen.items()},
        "fast_path": list(r.fast), "rounds": r.rounds,
    }


def dumps(r: Results) -> str:
    return json.dumps(to_json(r), indent=2) + "\n"


def from_json(doc: Mapping[str, Any]) -> Results:
    """The Results a :func:`to_json` document came from (to print or plot it again)."""
    counts = [row["count"] for row in doc["rows"]]
    r = Results(doc["collective"], doc["n"], doc["dtype"], counts, doc["iters"],
                doc["warmup"], doc.get("algorithm"), doc.get("check", False),
                list(doc["systems"]), machine=dict(doc.get("machine", {})),
                info=dict(doc.get("system_info", {})), errors=dict(doc.get("errors", {})))
    for row in doc["rows"]:
        for s, m in row["results"].items():
            r.data.setdefault(s, {})[row["count"]] = Measurement(m["time_us"], m.get("wrong"))
            if "rounds_us" in m:
                r.round_times.setdefault(s, {})[row["count"]] = list(m["rounds_us"])
    r.predicted = {a: {int(c): t for c, t in per.items()}
                   for a, per in doc.get("predicted_us", {}).items()}
    r.chosen = {int(c): a for c, a in doc.get("chosen", {}).items()}
    r.fast = [int(c) for c in doc.get("fast_path", [])]
    r.rounds = int(doc.get("rounds", 1))
    return r


# ----------------------------------------------------------------------------- plot


def matplotlib_missing() -> str | None:
    """None when matplotlib can be imported, else the message to show."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("--plot needs matplotlib, which is not installed (it is optional): "
                "pip install matplotlib")
    return None


def plot(r: Results, path: str) -> None:
    """busbw and latency against size, one line per system (a bar chart for barrier)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title = f"{r.collective}, n={r.n}, {r.dtype}"
    if r.collective == "barrier":
        fig, ax = plt.subplots(figsize=(5, 4))
        names = [s for s in r.systems if r.get(s, 0)]
        ax.bar(names, [r.get(s, 0).time_us for s in names])
        ax.set_ylabel("latency (us)")
        ax.set_title(title)
    else:
        fig, (bw, lat) = plt.subplots(1, 2, figsize=(11, 4.2))
        for s in r.systems:
            xs = [r.nbytes(c) for c in r.counts if r.get(s, c)]
            ms = [r.get(s, c) for c in r.counts if r.get(s, c)]
            if not ms:
                continue
            bus = [bandwidths(r.collective, r.n, x, m.time_us)[1] for x, m in zip(xs, ms)]
            bw.plot(xs, bus, marker="o", label=s)
            lat.plot(xs, [m.time_us for m in ms], marker="o", label=s)
        for ax in (bw, lat):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("size (bytes)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        lat.set_yscale("log")
        bw.set_ylabel("busbw (GB/s)")
        lat.set_ylabel("time (us)")
        bw.set_title(f"bus bandwidth: {title}")
        lat.set_title(f"latency: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_systems(values: Sequence[str] | None) -> list[str]:
    """``--vs gloo --vs mpi`` or ``--vs gloo,mpi`` -> ["gloo", "mpi"] (no duplicates)."""
    out: list[str] = []
    for v in values or ():
        for name in v.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name not in ("gloo", "mpi"):
                raise ValueError(f"--vs: unknown system {name!r}; choose gloo or mpi")
            if name not in out:
                out.append(name)
    return out
