"""The pure parts of ``minidist bench``: sizes, counts, busbw factors, table, JSON, checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from minidist.bench import report, worker
from minidist.bench.report import Measurement, Results

# ----------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("text, nbytes", [
    ("8", 8), ("0", 0), ("1K", 1024), ("1k", 1024), ("64M", 64 << 20), ("2G", 2 << 30),
    ("4KiB", 4096), ("16MB", 16 << 20), ("1.5K", 1536), (" 3 ", 3), (".5M", 512 << 10),
    (17, 17),
])
def test_parse_size(text, nbytes):
    assert report.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "K", "1X", "-1", "1.3", "1..2K", "1 K B", "abc", -4,
                                  True])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        report.parse_size(text)


def test_format_size():
    assert [report.format_size(s) for s in (8, 1024, 1536, 64 << 20, 1 << 30)] == \
        ["8", "1K", "1536", "64M", "1G"]


def test_size_sweep():
    assert report.size_sweep(8, 64 << 20, 4)[:3] == [8, 32, 128]
    assert report.size_sweep(8, 64 << 20, 4)[-1] == 32 << 20  # 8 * 4^k never hits 64M
    assert report.size_sweep(4, 64 << 20, 4)[-1] == 64 << 20
    assert len(report.size_sweep(4, 64 << 20, 4)) == 13
    assert report.size_sweep(8, 1024, 2) == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert report.size_sweep(16 << 20, 16 << 20, 2) == [16 << 20]
    for bad in ((16, 8, 2), (8, 16, 1), (0, 16, 2), (8, 16, 0.5)):
        with pytest.raises(ValueError):
            report.size_sweep(*bad)


def test_element_counts():
    # whole vector, at least one element; all_gather / reduce_scatter: multiples of n
    assert report.element_count("all_reduce", 4, 8, 4) == 1
    assert report.element_count("all_reduce", 2, 8, 4) == 1
    assert report.element_count("broadcast", 64 << 20, 8, 4) == 16 << 20
    assert report.element_count("all_gather", 8, 8, 4) == 8
    assert report.element_count("reduce_scatter", 100, 4, 4) == 24
    assert report.element_counts("all_reduce", [1, 2, 4, 8], 2, 4) == [1, 2]
    assert report.element_counts("barrier", [8, 16], 64, 4) == [0]


# ----------------------------------------------------------------------------- busbw


@pytest.mark.parametrize("collective, n, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75),
    ("all_reduce", 1, 0.0), ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875),
    ("broadcast", 8, 1.0), ("all_to_all", 4, 0.75), ("barrier", 64, None),
    ("pingpong", 2, 2.0), ("pingpong", 8, 2.0),
])
def test_bus_factor(collective, n, factor):
    assert report.bus_factor(collective, n) == factor


def test_bus_factor_rejects():
    with pytest.raises(ValueError):
        report.bus_factor("gather", 4)
    with pytest.raises(ValueError):
        report.bus_factor("all_reduce", 0)


def test_bandwidths():
    algbw, busbw = report.bandwidths("all_reduce", 8, 1_000_000_000, 1e6)  # 1 GB in 1 s
    assert algbw == pytest.approx(1.0) and busbw == pytest.approx(1.75)
    algbw, busbw = report.bandwidths("broadcast", 8, 16 << 20, 10_000.0)
    assert algbw == pytest.approx((16 << 20) / 1e-2 / 1e9) and busbw == algbw
    assert report.bandwidths("barrier", 8, 0, 10.0) == (None, None)
    assert report.bandwidths("all_reduce", 8, 8, 0.0) == (None, None)


def test_parse_systems():
    assert report.parse_systems(None) == []
    assert report.parse_systems(["gloo"]) == ["gloo"]
    assert report.parse_systems(["gloo,mpi", "GLOO"]) == ["gloo", "mpi"]
    with pytest.raises(ValueError, match="nccl"):
        report.parse_systems(["nccl"])


# ----------------------------------------------------------------------------- table


def _results(collective="all_reduce", n=4, systems=("minidist", "gloo"), check=False):
    counts = [1, 256, 4 << 20] if collective != "barrier" else [0]
    r = Results(collective, n, "float32", counts, iters=20, warmup=5, check=check,
                systems=list(systems), machine={"cpus": 2, "mem_gib": 23.5, "python": "3.11",
                                                "numpy": "2.4", "torch": None})
    r.data["minidist"] = {c: Measurement(100.0 * (i + 1), 0 if check else None)
                          for i, c in enumerate(counts)}
    if "gloo" in systems:
        r.data["gloo"] = {c: Measurement(300.0 * (i + 1), 0 if check else None)
                          for i, c in enumerate(counts[:-1] if collective != "barrier"
                                                else counts)}
    return r


def test_table_rows_and_columns():
    r = _results()
    text = report.format_table(r)
    lines = text.splitlines()
    head = [ln for ln in lines if ln.startswith("#")]
    rows = [ln.split() for ln in lines if not ln.startswith("#")]
    assert "n=4" in head[0] and "vs gloo" in head[0]
    assert any("busbw = algbw x 2(n-1)/n" in ln for ln in head)
    assert any("torch not installed" in ln for ln in head)
    assert any(ln.split()[1:4] == ["size", "count", "type"] for ln in head)
    assert [row[:3] for row in rows] == [["4", "1", "float32"], ["1024", "256", "float32"],
                                        [str(16 << 20), str(4 << 20), "float32"]]
    # size time algbw busbw | time algbw busbw | ratio
    assert all(len(row) == 3 + 3 + 3 + 1 for row in rows)
    first = rows[0]
    assert float(first[3]) == 100.0 and float(first[6]) == 300.0
    assert float(first[-1]) == pytest.approx(3.0)
    last = rows[-1]  # gloo did not get there: dashes, no ratio
    assert last[6:] == ["-", "-", "-", "-"]
    algbw = (16 << 20) / 300e-6 / 1e9
    assert float(last[4]) == pytest.approx(algbw, abs=1e-3)
    assert float(last[5]) == pytest.approx(algbw * 1.5, abs=1e-3)
    assert "# Avg bus bandwidth: minidist" in text


def test_table_aligned():
    for check in (False, True):
        lines = report.table_lines(_results(check=check))
        widths = {len(ln) for ln in lines[1:2] + lines[3:]}
        assert len(widths) == 1, lines  # column header and rows line up


def test_table_check_column_and_errors():
    r = _results(check=True)
    r.data["minidist"][256] = Measurement(200.0, 3)
    r.errors["gloo"] = "gloo: timed out after 9 s"
    text = report.format_table(r)
    assert "#wrong" in text
    assert "# Out of bounds values: 3 FAILED" in text
    assert "# gloo FAILED: gloo: timed out after 9 s" in text
    rows = [ln.split() for ln in text.splitlines() if not ln.startswith("#")]
    assert rows[1][6] == "3"


def test_table_minidist_only_and_barrier():
    rows = [ln for ln in report.table_lines(_results(systems=("minidist",)))
            if not ln.startswith("#")]
    assert all(len(ln.split()) == 6 for ln in rows)
    r = _results("barrier", n=64)
    lines = report.table_lines(r)
    assert "time(us)" in lines[1] and "x gloo" in lines[0]
    assert lines[-1].split() == ["100.0", "300.0", "3.00"]
    text = report.format_table(r)
    assert "algbw" not in text and "Avg bus" not in text


def test_json_document():
    r = _results()
    doc = json.loads(report.dumps(r))
    assert doc["collective"] == "all_reduce" and doc["n"] == 4 and doc["bus_factor"] == 1.5
    assert doc["systems"] == ["minidist", "gloo"]
    assert [row["size"] for row in doc["rows"]] == [4, 1024, 16 << 20]
    first = doc["rows"][0]
    assert first["results"]["minidist"]["time_us"] == 100.0
    assert first["ratio"]["gloo"] == pytest.approx(3.0)
    assert doc["rows"][-1]["ratio"]["gloo"] is None
    assert "gloo" not in doc["rows"][-1]["results"]
    again = report.from_json(doc)
    assert report.format_table(again) == report.format_table(r)


def test_rounds_give_median_times_and_the_median_of_paired_ratios():
    r = Results("all_reduce", 2, "float32", [1, 256], iters=20, warmup=5,
                systems=["minidist", "mpi"], rounds=3)
    # a slow spell in the second round slows both systems: it cancels out of the ratio
    for mine, theirs in ((100.0, 150.0), (400.0, 500.0), (110.0, 120.0)):
        r.add_round("minidist", {1: Measurement(mine), 256: Measurement(mine * 2, 0)})
        r.add_round("mpi", {1: Measurement(theirs)})
    assert r.get("minidist", 1).time_us == 110.0 and r.get("mpi", 1).time_us == 150.0
    assert r.get("minidist", 256).wrong == 0
    assert r.ratio("mpi", 1) == pytest.approx(1.25)  # median of 1.5, 1.25, 1.09
    assert r.ratio("mpi", 1) != pytest.approx(150.0 / 110.0)  # not the medians' ratio
    assert r.ratio("mpi", 256) is None  # mpi never ran that size
    text = report.format_table(r)
    assert "rounds=3" in text.splitlines()[0]
    assert any("median of the ratios within a round" in ln for ln in text.splitlines())
    doc = json.loads(report.dumps(r))
    assert doc["rounds"] == 3
    assert doc["rows"][0]["results"]["mpi"]["rounds_us"] == [150.0, 500.0, 120.0]
    assert doc["rows"][0]["ratio"]["mpi"] == pytest.approx(1.25)
    again = report.from_json(doc)
    assert again.ratio("mpi", 1) == pytest.approx(1.25)
    assert report.format_table(again) == text
    # a round that lost a system (it failed): the ratio falls back to the medians'
    r.add_round("minidist", {1: Measurement(90.0)})
    assert r.ratio("mpi", 1) == pytest.approx(150.0 / r.get("minidist", 1).time_us)


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    for collective in ("all_reduce", "barrier"):
        out = tmp_path / f"{collective}.png"
        report.plot(_results(collective), str(out))
        assert out.read_bytes()[:4] == b"\x89PNG"


def test_matplotlib_missing_message(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert "pip install matplotlib" in report.matplotlib_missing()


# ----------------------------------------------------------------------------- checks


def _simulate(collective: str, n: int, count: int, dtype: str) -> list[dict]:
    """Every rank's buffers after a correct collective, done here in numpy."""
    ranks = [worker.make_buffers(collective, count, n, dtype) for _ in range(n)]
    for r, bufs in enumerate(ranks):
        worker.fill_for_check(collective, bufs, r, n)
    if collective == "all_reduce":
        total = sum(b["buf"].astype(np.int64) for b in ranks).astype(dtype)
        for b in ranks:
            b["buf"][:] = total
    elif collective == "broadcast":
        for b in ranks[1:]:
            b["buf"][:] = ranks[0]["buf"]
    elif collective == "all_gather":
        gathered = np.concatenate([b["inp"] for b in ranks])
        for b in ranks:
            b["out"][:] = gathered
    elif collective == "reduce_scatter":
        total = sum(b["inp"].astype(np.int64) for b in ranks).astype(dtype)
        per = count // n
        for r, b in enumerate(ranks):
            b["out"][:] = total[r * per:(r + 1) * per]
    elif collective == "pingpong":  # there and back: both hold the even rank's buffer
        for r in range(1, n, 2):
            ranks[r]["buf"][:] = ranks[r - 1]["buf"]
    return ranks


@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "all_gather",
                                        "reduce_scatter", "pingpong"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "int8", "uint8", "int64"])
def test_check_pattern(collective, dtype):
    n, count = 5, 5 * 7
    ranks = _simulate(collective, n, count, dtype)
    assert [worker.count_wrong(collective, b, r, n) for r, b in enumerate(ranks)] == [0] * n
    out = "buf" if collective in ("all_reduce", "broadcast", "pingpong") else "out"
    ranks[2][out][1] += 1
    assert worker.count_wrong(collective, ranks[2], 2, n) == 1


def test_check_pattern_exact_for_many_ranks():
    # sums over 64 ranks stay exact in float16 and wrap consistently in int8
    for dtype in ("float16", "int8"):
        ranks = _simulate("all_reduce", 64, 16, dtype)
        assert worker.count_wrong("all_reduce", ranks[0], 0, 64) == 0


def test_pingpong_pairs_even_ranks_with_the_next_and_idles_a_last_odd_one():
    log = []
    calls = [worker.pingpong(r, 5, "buf", lambda b, d, r=r: log.append((r, "send", d)),
                             lambda b, s, r=r: log.append((r, "recv", s))) for r in range(5)]
    for c in calls:
        c()
    assert log == [(0, "send", 1), (0, "recv", 1), (1, "recv", 0), (1, "send", 0),
                   (2, "send", 3), (2, "recv", 3), (3, "recv", 2), (3, "send", 2)]
    b = worker.make_buffers("pingpong", 8, 5, "float32")
    worker.fill_for_check("pingpong", b, 4, 5)
    assert worker.count_wrong("pingpong", b, 4, 5) == 0  # rank 4 has no partner


def test_make_buffers_shapes():
    b = worker.make_buffers("all_gather", 12, 4, "float32")
    assert b["inp"].size == 3 and b["out"].size == 12 and b["out"].dtype == np.float32
    b = worker.make_buffers("reduce_scatter", 12, 4, "int8")
    assert b["inp"].size == 12 and b["out"].size == 3
    assert worker.make_buffers("barrier", 0, 4, "float32") == {}
    assert not worker.make_buffers("all_reduce", 8, 2, "float64")["buf"].any()
