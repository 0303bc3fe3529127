"""minidist.tracing without processes: off unless MINIDIST_TRACE is set, bounded in
memory, and merging rank files into one trace."""

from __future__ import annotations

import atexit
import json

import pytest

from minidist import env, tracing
from minidist.group import Group


def test_off_unless_the_variable_names_a_directory(tmp_path):
    assert env.trace_dir({}) is None and env.trace_dir({"MINIDIST_TRACE": ""}) is None
    assert tracing.from_env({}, "job", 0) is None
    t = tracing.from_env({"MINIDIST_TRACE": str(tmp_path)}, "job", 3)
    assert t is not None and t.path == str(tmp_path / "job-rank3.json")
    assert tracing.from_env({"MINIDIST_TRACE": str(tmp_path)}, "job", 3) is t  # re-init
    atexit.unregister(t.flush)
    del tracing._tracers[(str(tmp_path), "job", 3)]


def test_bounded_and_written_as_a_chrome_trace(tmp_path):
    t = tracing.Tracer(str(tmp_path / "new"), "j", 1, max_events=10)
    world = Group(0, (0, 1))
    for i in range(25):
        t.span("x", "step", t.tid(world), i * 1000, i * 1000 + 500, {"i": i})
    t.flush()
    doc = json.loads((tmp_path / "new" / "j-rank1.json").read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["args"]["i"] for e in spans] == list(range(15, 25))  # the last ones kept
    assert spans[0]["ts"] == 15.0 and spans[0]["dur"] == 0.5 and spans[0]["pid"] == 1
    assert doc["otherData"]["dropped"] == 15
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"]
    assert names == ["world: calls"]


def test_merge_aligns_the_ranks_on_the_first_event(tmp_path):
    world = Group(0, (0, 1))
    for rank, start in ((0, 5_000_000), (1, 2_000_000)):
        t = tracing.Tracer(str(tmp_path), "job1", rank)
        t.span("call", "collective", t.tid(world), start, start + 1000, {})
        t.flow(rank == 0, tracing.flow_id(0, 0, 0, 1, 0), t.tid(world), start)
        t.flush()
    (tmp_path / "job1-rank2.json").write_text("{not json")
    assert tracing.merge(str(tmp_path)) == [str(tmp_path / "job1.json")]
    doc = json.loads((tmp_path / "job1.json").read_text())
    spans = {e["pid"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert spans[1]["ts"] == 0 and spans[0]["ts"] == 3000.0
    assert doc["otherData"]["t0_unix_us"] == 2000.0
    assert doc["otherData"]["ranks"] == [0, 1]
    assert doc["otherData"]["unreadable"] == [str(tmp_path / "job1-rank2.json")]
    # the merged file is not taken for a rank's; two jobs need --job with --out
    t = tracing.Tracer(str(tmp_path), "job2", 0)
    t.flush()
    with pytest.raises(ValueError, match="--job"):
        tracing.merge(str(tmp_path), out=str(tmp_path / "x.json"))
    assert tracing.merge(str(tmp_path), job="job2", out=str(tmp_path / "x.json")) == [
        str(tmp_path / "x.json")]
    with pytest.raises(FileNotFoundError):
        tracing.merge(str(tmp_path), job="job3")
