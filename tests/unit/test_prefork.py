"""The launcher's free heap blocks are taken before it forks the ranks (so a rank's own
allocations do not land between the launcher's live objects), without growing its heap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, json, sys
import numpy  # noqa: F401  (what a launcher has imported: holes in both heaps)
from minidist.launch import prefork, ranks
ranks.preload([], "1")
def c_heap():
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = prefork._MallInfo2
        m = libc.mallinfo2()
        return {"holes": m.fordblks - m.keepcost, "arena": m.arena}
    except AttributeError:
        return None
def pymalloc_free():
    return sum(size * n for size, n in prefork.pymalloc_free_blocks())
before = {"py": pymalloc_free(), "c": c_heap()}
taken = prefork.fill_holes()
after = {"py": pymalloc_free(), "c": c_heap()}
print(json.dumps({"before": before, "after": after, "taken": taken}))
"""


def probe(env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_free_blocks_are_taken_without_growing_the_heap():
    r = probe()
    before, after = r["before"], r["after"]
    if before["py"] == 0:
        pytest.skip("this interpreter reports no pymalloc pools")
    assert before["py"] > 64 * 1024, before
    assert after["py"] < before["py"] / 3, r
    if before["c"] is not None:  # glibc 2.33 or later
        assert after["c"]["arena"] == before["c"]["arena"], r  # no sbrk: holes only
        assert after["c"]["holes"] < before["c"]["holes"] / 3, r
    assert r["taken"] > 0


def test_without_pymalloc_nothing_is_read_from_the_interpreter():
    import os
    r = probe({**os.environ, "PYTHONMALLOC": "malloc"})
    assert r["before"]["py"] == 0 and r["after"]["py"] == 0
