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
                                "tree", "tree"]
    assert lines[1].split()[-2:] == ["tree", "ring"]  # chosen, fastest measured
    assert "# pred: the cost model's replay" in text
    again = report.from_json(json.loads(report.dumps(r)))
    assert again.predicted == r.predicted and again.chosen == r.chosen


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


def test_an_unknown_algorithm_is_refused_before_anything_runs():
    p = bench("all_reduce", "-n", "2", "--algorithm", "ring,nope")
    assert p.returncode == 2 and "unknown all_reduce algorithm 'nope'" in p.stderr
