"""benchmarks/copied_words.py names what a forked child changed in its copies of its
parent's pages: a child that takes a reference to many strings its parent made (and
changes nothing else of theirs) must find their reference counts among the changed
words, on about as many pages as the strings fill; a child that changes nothing of
them must not."""

from __future__ import annotations

import io
import os
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import copied_words  # noqa: E402

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.version_info[:2] != (3, 11) or sys.platform != "linux",
                       reason="reads CPython 3.11's objects on Linux"),
    pytest.mark.skipif(os.geteuid() != 0, reason="reads the parent's memory: root"),
]

STRINGS = 20_000  # about 64 bytes each: some 300 pages


def _child_report(touch: bool) -> str:
    """What copied_words.report says in a child forked now that, if ``touch``, holds a
    second reference to each of ``STRINGS`` strings made here."""
    made = [f"copied-words-test-{i:06d}-{'x' * 16}" for i in range(STRINGS)]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave, whatever happens
        code = 1
        try:
            os.close(read)
            held = list(made) if touch else None
            out = io.StringIO()
            with redirect_stdout(out):
                copied_words.report(os.getppid(), top=40)
            del held
            os.write(write, out.getvalue().encode())
            code = 0
        except BaseException:
            import traceback

            os.write(write, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    del made
    text = b"".join(chunks).decode()
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


def _pages_of(report: str, what: str) -> int:
    for line in report.splitlines():
        m = re.match(r"\s+(\d+)\s+(\d+)\s+(.*)$", line)
        if m and m[3] == what:
            return int(m[1])
    return 0


def test_a_childs_references_to_its_parents_strings_are_named() -> None:
    report = _child_report(touch=True)
    assert "copied words:" in report, report
    # each of ~300 pages of strings holds a changed reference count
    assert _pages_of(report, "str: reference count") >= 200, report


def test_a_child_that_leaves_them_alone_changes_few_of_them() -> None:
    report = _child_report(touch=False)
    assert "copied words:" in report, report
    assert _pages_of(report, "str: reference count") < 100, report
