"""``minidist bench --algorithm all|A,B|module:function --predict``: one column per
algorithm, the cost model's prediction and minidist's choice beside the measurements."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minidist.bench import report, runner

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def bench(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minidist", "bench", *args],
                          capture_output=True, text=True, timeout=110,
                          env=runner.clean_env(**env), cwd=cwd, stdin=subprocess.DEVNULL)


def test_the_algorithms_table_from_results():
    r = report.Results("all_reduce", 4, "float32", [256, 4096], 5, 1, "all",
                       systems=["minidist/ring", "minidist/tree"])
    r.data = {"minidist/ring": {256: report.Measurement(90.0), 4096: report.Measurement(80.0)},
              "minidist/tree": {256: report.Measurement(50.0), 4096: report.Measurement(85.0)}}
    r.predicted = {"ring": {256: 100.0, 4096: 120.0}, "tree": {256: 60.0, 4096: 70.0}}
    r.chosen = {256: "tree", 4096: "tree"}
    text = report.format_table(r)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0].split() == ["1024", "256", "float32", "90.0", "100.0", "50.0", "60.0",
                                "tree", "tree", "1.00"]
    # chosen, fastest measured, the choice's time over the fastest
    assert lines[1].split()[-3:] == ["tree", "ring", "1.06"]
    assert "# pred: the cost model's replay" in text
    assert "# minidist's choice measured within 1.2x of the fastest at 2 of 2 sizes" in text
    assert "shared slots" not in text
    again = report.from_json(json.loads(report.dumps(r)))
    assert again.predicted == r.predicted and again.chosen == r.chosen


def test_the_choice_summary_counts_sizes_and_marks_the_fast_path():
    r = report.Results("all_reduce", 4, "float32", [1, 1024, 1 << 20], 5, 1, "all",
                       systems=["minidist/recursive_doubling", "minidist/tree"])
    times = {1: (100.0, 130.0), 1024: (100.0, 110.0), 1 << 20: (300.0, 200.0)}
    for count, (rd, tree) in times.items():
        r.data.setdefault("minidist/recursive_doubling", {})[count] = report.Measurement(rd)
        r.data.setdefault("minidist/tree", {})[count] = report.Measurement(tree)
        r.chosen[count] = "tree"
    r.predicted = {"tree": {c: 1.0 for c in times}}
    r.fast = [1, 1024]  # small enough for the shared slots
    assert report.choice_ratios(r) == pytest.approx({1: 1.3, 1024: 1.1, 1 << 20: 1.0})
    text = report.format_table(r)
    assert "within 1.2x of the fastest at 2 of 3 sizes" in text
    rows = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert [row[-3] for row in rows] == ["tree*", "tree*", "tree"]
    assert "shared slots (the fast path)" in text
    assert report.from_json(json.loads(report.dumps(r))).fast == [1, 1024]


def test_every_algorithm_with_predictions_and_one_of_your_own(tmp_path):
    (tmp_path / "bench_mine.py").write_text(
        "from minidist.algorithms import Schedule, make_schedule\n"
        "def my_tree(rank: int, size: int, count: int, root: int = 0) -> Schedule:\n"
        "    return make_schedule('all_reduce', 'tree', rank, size, count)\n")
    p = bench("all_reduce", "-n", "3", "-b", "1K", "-e", "4K", "-f", "4", "--iters", "3",
              "--warmup", "1", "--algorithm", "all", "--predict", "--json", "-",
              "--algo-module", "bench_mine", cwd=tmp_path,
              PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    columns = {s for row in doc["rows"] for s in row["results"]}
    assert {"minidist/ring", "minidist/rabenseifner", "minidist/my_tree"} <= columns
    assert set(doc["predicted_us"]) >= {"ring", "tree", "my_tree", "double_binary_tree"}
    assert all(a in ("recursive_doubling", "tree", "ring", "shared_memory")
               for a in doc["chosen"].values())


def test_module_function_and_a_printed_table(tmp_path):
    (tmp_path / "bench_mine2.py").write_text(
        "from minidist.algorithms import make_schedule\n"
        "def halving(rank, size, count, root=0):\n"
        "    return make_schedule('all_reduce', 'rabenseifner', rank, size, count)\n")
    p = bench("all_reduce", "-n", "2", "-b", "4K", "-e", "4K", "--iters", "3", "--warmup",
              "1", "--algorithm", "bench_mine2:halving,ring", "--predict", "--check",
              cwd=tmp_path, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    assert p.returncode == 0, p.stderr
    assert "minidist chooses" in p.stdout and "fastest measured" in p.stdout
    assert "halving" in p.stdout and "# Out of bounds values: 0 OK" in p.stdout


def test_all_to_all_checked_with_its_choice():
    p = bench("all_to_all", "-n", "4", "-b", "64", "-e", "4M", "-f", "65536", "--iters",
              "2", "--warmup", "1", "--algorithm", "all", "--predict", "--check", "--json",
              "-")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert {s for row in doc["rows"] for s in row["results"]} == {"minidist/pairwise",
                                                                   "minidist/bruck"}
    assert all(m["wrong"] == 0 for row in doc["rows"] for m in row["results"].values())
    # a few bytes per block: Bruck's few messages; a MiB per block: pairwise
    assert [doc["chosen"][str(row["count"])] for row in doc["rows"]] == ["bruck", "pairwise"]
    assert doc["fast_path"] == []


def test_an_unknown_algorithm_is_refused_before_anything_runs():
    p = bench("all_reduce", "-n", "2", "--algorithm", "ring,nope")
    assert p.returncode == 2 and "unknown all_reduce algorithm 'nope'" in p.stderr
