"""Pictures (draw) and the ``minidist algo`` command: list, check, show, trace, cost."""

from __future__ import annotations

import importlib.util
import json
import sys
import xml.etree.ElementTree as ET

import pytest

from minidist.__main__ import main
from minidist.algo_cli import parse_nodes, parse_sizes
from minidist.algorithms import ALGORITHMS, draw, schedules, unregister

pytestmark = pytest.mark.timeout(120)

MINE = '''
import dataclasses
from minidist.algorithms import Schedule, Step, make_schedule


def halving_doubling(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    return make_schedule("all_reduce", "rabenseifner", rank, size, count)


def off_by_one(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    s = make_schedule("all_reduce", "ring", rank, size, count)
    if size == 5 and rank == 2 and count == 6:
        steps = list(s.steps)
        steps[1] = Step(steps[1].comms, ())
        s = dataclasses.replace(s, steps=tuple(steps))
    return s
'''


@pytest.fixture
def mine(tmp_path, monkeypatch):
    """A module of algorithms on sys.path; forgotten afterwards."""
    (tmp_path / "algo_cli_mine.py").write_text(MINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("MINIDIST_ALGO_MODULE", raising=False)
    before = {c: set(a) for c, a in ALGORITHMS.items()}
    yield tmp_path
    for c, names in list(ALGORITHMS.items()):
        for a in names:
            if a not in before[c]:
                unregister(c, a)
    sys.modules.pop("algo_cli_mine", None)


def test_text_picture_of_a_ring():
    text = draw.to_text(schedules("all_reduce", "ring", 4, 8))
    lines = text.splitlines()
    assert lines[0] == "all_reduce / ring: 4 ranks, count 8"
    assert "   0 | >1 <3 + | >1 <3 + | >1 <3 + | >1 <3   | >1 <3   | >1 <3" in text
    assert "    1:   0 -> 1   out[6:8] -> tmp[0:2]  reduced" in text
    assert "    4:   0 -> 1   out[0:2] -> out[0:2]  stored" in text


def test_svg_has_an_arrow_and_label_per_message_and_a_legend():
    scheds = schedules("all_reduce", "hierarchical", 6, 6, nodes=(0, 0, 0, 1, 1, 1))
    svg = draw.to_svg(draw.layout(scheds))
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    msgs = draw.messages(scheds)
    assert len(root.findall(f"{ns}polygon")) == len(msgs)
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert "tmp[0:6]" in texts
    assert any(t and t.startswith("phase 1:") for t in texts)  # composed: phases coloured
    assert "rank 5" in texts


def test_columns_keep_a_message_no_later_than_its_receive():
    scheds = schedules("broadcast", "pipeline", 5, 40, root=2)
    msgs = draw.messages(scheds)
    col = draw.columns(scheds, msgs)
    for m in msgs:
        assert col[m.dst][m.dst_step] >= col[m.src][m.src_step]
    for c in col:
        assert c == sorted(set(c))


def test_parsing_sizes_and_nodes():
    assert parse_sizes("1-4,8") == [1, 2, 3, 4, 8]
    assert parse_nodes("2", 5) == (0, 0, 0, 1, 1)
    assert parse_nodes("0,1,0", 3) == (0, 1, 0)
    assert parse_nodes(None, 3) is None


def test_list(capsys, mine):
    assert main(["algo", "list", "all_reduce", "--module", "algo_cli_mine"]) == 0
    out = capsys.readouterr().out
    assert "rabenseifner           built in (wire index 5)" in out
    assert "halving_doubling       registered, algo_cli_mine.halving_doubling" in out


def test_check_passes_and_fails_with_the_exit_code(capsys, mine):
    assert main(["algo", "check", "all_reduce", "algo_cli_mine:halving_doubling",
                 "-n", "1-12"]) == 0
    assert "holds for N = 1-12" in capsys.readouterr().out
    assert main(["algo", "check", "all_reduce", "algo_cli_mine:off_by_one", "-n", "1-8"]) == 1
    out = capsys.readouterr().out
    assert "FAILS at N=5, count=6, root=0, rank" in out and "step" in out


def test_show_writes_svg_and_text(tmp_path, capsys):
    svg = tmp_path / "ring.svg"
    assert main(["algo", "show", "all_reduce", "ring", "-n", "4", "--count", "8",
                 "--out", str(svg)]) == 0
    ET.fromstring(svg.read_text())
    assert main(["algo", "show", "reduce", "rabenseifner", "-n", "6", "--root", "2",
                 "--out", "-"]) == 0
    assert "reduce / rabenseifner: 6 ranks, count 12, root 2" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is not None,
                    reason="matplotlib is installed")
def test_png_without_matplotlib_says_what_to_install(tmp_path, capsys):
    assert main(["algo", "show", "all_reduce", "ring", "-n", "3", "--out",
                 str(tmp_path / "x.png")]) == 2
    assert "matplotlib" in capsys.readouterr().err


def test_trace_writes_a_chrome_trace(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["algo", "trace", "all_reduce", "double_binary_tree", "-n", "6",
                 "--bytes", "64K", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["otherData"]["predicted_us"] > 0
    assert any(e.get("name") == "send to 1" for e in doc["traceEvents"])
    assert "predicted" in capsys.readouterr().out


def test_cost_lists_every_algorithm_with_bounds(capsys, mine):
    assert main(["algo", "cost", "all_reduce", "-n", "8", "--bytes", "1M",
                 "--algorithm", "algo_cli_mine:halving_doubling"]) == 0
    out = capsys.readouterr().out
    assert "latency    ceil(log2 n) * alpha_s" in out
    assert "bandwidth  2(n-1)/n * N * beta_s" in out
    for name in ALGORITHMS["all_reduce"]:
        assert name in out
    assert "<- minidist's choice" in out
    assert main(["algo", "cost", "all_reduce", "-n", "8", "--bytes", "1M", "--nodes", "2",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["algorithm"]: r for r in doc["algorithms"]}
    assert "error" in rows["shared_memory"] and rows["ring"]["percent_of_bound"] > 0
    assert doc["minidist_chooses"] == "hierarchical"


@pytest.mark.parametrize("argv", [
    ["algo", "check", "all_reduce", "nope"],
    ["algo", "check", "all_reduce", "ring", "-n", "0-3"],
    ["algo", "show", "all_reduce", "ring", "-n", "4", "--out", "x.pdf"],
    ["algo", "cost", "all_reduce", "-n", "4", "--bytes", "lots"],
    ["algo", "check", "all_reduce", "no_such_module_x:fn"],
])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("minidist algo: error:") and err.count("\n") == 1
