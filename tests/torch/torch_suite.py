"""PyTorch's own distributed test suite on minidist (and on gloo, for comparison).

torch ships its distributed tests in the wheel
(``torch/testing/_internal/distributed/distributed_test.py``); upstream's
``test/distributed/test_distributed_spawn.py`` runs its ``_DistTestBase`` once per
backend, every test in new processes of ``WORLD_SIZE`` ranks. This module does the
same for three modes:

* ``gloo``: torch's gloo, the reference;
* ``plugin``: minidist as a third-party backend (``BACKEND=minidist``), declared to the
  suite through its hooks (``DistTestCases.backend_feature["plugin"]``, ``"ddp"`` and
  ``"subgroup"``), so the suite runs what it runs for any backend that claims them;
* ``swap``: minidist wherever the suite expects gloo: the suite runs as for gloo
  (``BACKEND=gloo``: gloo's selection of tests and gloo's expectations), but every
  process group is made by minidist (``init_process_group``, ``new_group`` and
  ``new_subgroups[_by_enumeration]`` get "minidist" for "gloo"), and
  ``torch.distributed.monitored_barrier``, which torch allows only on gloo groups, goes
  to the group's own ``monitored_barrier`` (what torch calls for gloo groups).

The ranks of a test are forked from the runner by default (a test takes a second or
two); ``--start spawn`` starts them as fresh interpreters, as upstream does (several
times slower; the outcomes are the same).

Run it by hand (prints one line per test and a summary; ``--json`` writes the outcomes,
updated after every test)::

    python -m tests.torch.torch_suite --mode plugin --world-size 2 [-k NAME ...]

``tests/torch/test_torch_suite.py`` drives it under pytest: the subset :data:`DEFAULT`
in the default test run, everything with ``-m slow``. :data:`SKIPS` lists every
test that cannot pass on minidist, with the reason; the suite skips them in the
minidist modes (``--no-skips`` runs them anyway).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import types
import unittest

MODES = ("gloo", "plugin", "swap")

#: tests that cannot pass on minidist: name -> (modes, reason). Skipped in those modes.
SKIPS: dict[str, tuple[tuple[str, ...], str]] = {
    "test_get_backend": (
        ("swap",),
        "asserts that get_backend() is 'gloo'; in this mode the groups' backend is "
        "'minidist' (the test passes in plugin mode)"),
}

#: the subset the default test run takes (world size 2, every process group made by the
#: "minidist" backend): mode -> tests. Collectives (coalesced, sparse, async and their
#: Futures), point-to-point (tags, batches, any source), groups and subgroups,
#: destroy_group, barrier and monitored_barrier timeouts, DDP (with a comm hook) and
#: error paths (bad arguments, unsupported ops); about 20 s on two cores.
DEFAULT: dict[str, tuple[str, ...]] = {
    "plugin": (
        "test_all_reduce_sum_async", "test_broadcast", "test_all_gather_coalesced_simple",
        "test_scatter_checks", "test_send_recv_with_tag", "test_send_recv_any_source",
        "test_get_rank_size_group", "test_destroy_group", "test_destroy_full_group",
        "test_DistributedDataParallelCPU",
    ),
    "swap": (
        "test_all_reduce_coalesced_sum", "test_sparse_all_reduce_sum",
        "test_all_reduce_complex_unsupported_ops", "test_get_future",
        "test_batch_isend_irecv_gloo_tags", "test_all_gather_object_subgroup",
        "test_barrier_timeout_full_group", "test_monitored_barrier_gloo_subgroup",
        "test_monitored_barrier_gloo_rank_0_timeout",
        "test_accumulate_gradients_no_sync_allreduce_hook",
    ),
}

#: a wider selection (``-m slow -k representative``): (mode, world size) -> tests
QUICK: dict[tuple[str, int], tuple[str, ...]] = {
    ("plugin", 2): (
        "test_all_reduce_sum", "test_all_reduce_sum_complex", "test_all_reduce_product",
        "test_all_reduce_sum_async", "test_reduce_sum", "test_broadcast", "test_all_gather",
        "test_all_gather_coalesced_simple", "test_all_gather_coalesced_with_empty",
        "test_scatter", "test_gather", "test_send_recv", "test_send_recv_with_tag",
        "test_isend", "test_irecv", "test_barrier", "test_destroy_group",
        "test_destroy_full_group", "test_get_backend", "test_DistributedDataParallelCPU",
        "test_ddp_logging_data_cpu", "test_static_graph_api_cpu",
    ),
    ("swap", 2): (
        "test_monitored_barrier_gloo", "test_monitored_barrier_gloo_subgroup",
        "test_monitored_barrier_gloo_rank_0_timeout", "test_barrier_timeout_full_group",
        "test_sparse_all_reduce_sum", "test_all_gather_coalesced_complex",
        "test_all_reduce_coalesced_sum", "test_batch_isend_irecv_gloo",
        "test_batch_isend_irecv_gloo_tags", "test_get_future",
        "test_accumulate_gradients_no_sync_allreduce_hook",
        "test_all_gather_object_default_pg", "test_scatter_object_list",
        "test_grads_same_across_ranks_with_no_sync",
    ),
    ("swap", 4): (
        "test_gather_object", "test_gather_object_subgroup",
        "test_new_subgroups_with_group_param",
    ),
    ("swap", 8): (
        "test_barrier_timeout_group", "test_monitored_barrier_failure_order",
        "test_monitored_barrier_wait_all_ranks", "test_all_reduce_group_sum",
        "test_broadcast_group", "test_barrier_group",
    ),
    ("plugin", 8): (
        "test_all_gather_coalesced_group", "test_reduce_group_sum", "test_scatter_group",
    ),
}

#: at world size 8, the tests whose names contain one of these (groups of some ranks,
#: subgroups, barriers and monitored barriers): torch 2.13 runs its tests of a group of
#: some ranks only at world size 8 or more (``skip_if_small_worldsize``); the rest of
#: the suite is what world sizes 2 to 4 cover
MATCH_8 = ("group", "barrier")

#: seconds one test of the suite may take (all its processes), unless the suite's own
#: override for that test is shorter
PER_TEST_TIMEOUT = 180


# ---------------------------------------------------------------------- set-up


def _environment(mode: str, world_size: int) -> None:
    """What the suite reads when it is imported (in this process and in every process
    it spawns, which inherit the environment)."""
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}; one of {MODES}")
    os.environ["MINIDIST_SUITE_MODE"] = mode
    os.environ["BACKEND"] = "minidist" if mode == "plugin" else "gloo"
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("INIT_METHOD", "env://")
    os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", str(PER_TEST_TIMEOUT))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "TEMP_DIR" not in os.environ:  # each test makes its own; this one is for import
        tmp = tempfile.mkdtemp(prefix="minidist-torch-suite-")
        os.makedirs(os.path.join(tmp, "barrier"), exist_ok=True)
        os.environ["TEMP_DIR"] = tmp
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)


def _swap_backends() -> None:
    """Make every process group with minidist where the suite asks for gloo."""
    import functools

    import torch.distributed as dist

    from minidist.torch import _backend

    def swap(b):
        return _backend.BACKEND if b is not None and str(b).lower() == "gloo" else b

    def wrap(fn, pos):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if "backend" in kwargs:
                kwargs["backend"] = swap(kwargs["backend"])
            elif len(args) > pos:
                args = (*args[:pos], swap(args[pos]), *args[pos + 1:])
            return fn(*args, **kwargs)
        return wrapper

    dist.init_process_group = wrap(dist.init_process_group, 0)
    dist.new_group = wrap(dist.new_group, 2)
    dist.new_subgroups = wrap(dist.new_subgroups, 3)
    dist.new_subgroups_by_enumeration = wrap(dist.new_subgroups_by_enumeration, 2)

    monitored = dist.monitored_barrier

    @functools.wraps(monitored)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        # torch.distributed.monitored_barrier accepts gloo groups only; what it does for
        # them (after its checks) is the group's own monitored_barrier
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        if isinstance(pg, _backend.ProcessGroupMinidist):
            if dist.distributed_c10d._rank_not_in_group(group):
                return None
            if isinstance(timeout, (int, float)):
                import datetime
                timeout = datetime.timedelta(seconds=timeout)
            return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        return monitored(group, timeout, wait_all_ranks)

    dist.monitored_barrier = monitored_barrier


def _expecttest() -> None:
    """torch.testing._internal imports ``expecttest`` (a test-only package) for features
    the distributed suite never uses; a stand-in when it is not installed."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase
        sys.modules["expecttest"] = stub


def build() -> type:
    """The test class for the mode in the environment (like upstream's
    ``TestDistBackendWithSpawn``); defined in this module's namespace, so that the
    processes it spawns find it."""
    mode = os.environ["MINIDIST_SUITE_MODE"]
    _expecttest()
    import torch
    from torch.testing._internal import common_distributed as cd

    if mode != "gloo":
        import minidist.torch  # noqa: F401  registers the "minidist" backend

    if mode == "plugin":
        for feature in ("plugin", "ddp", "subgroup"):
            cd.DistTestCases.backend_feature[feature].add("minidist")
    elif mode == "swap":
        _swap_backends()
    # no test runs longer than the suite's per-test limit
    for name, limit in list(cd.TIMEOUT_OVERRIDE.items()):
        cd.TIMEOUT_OVERRIDE[name] = min(limit, cd.TIMEOUT_DEFAULT)

    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest,
        TestDistBackend,
    )

    skips = {} if os.environ.get("MINIDIST_SUITE_NO_SKIPS") == "1" else {
        name: reason for name, (modes, reason) in SKIPS.items() if mode in modes}

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            name = self._testMethodName
            if name in skips:
                raise unittest.SkipTest(f"minidist: {skips[name]}")
            super().setUp()
            if os.environ.get("MINIDIST_SUITE_START") == "fork":
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    cls = TestDistBackendWithSpawn
    cls.__name__ = cls.__qualname__ = f"TestDistBackendWithSpawn{mode.upper()}"
    cls.__module__ = __name__
    globals()[cls.__name__] = cls
    return cls


if os.environ.get("MINIDIST_SUITE_MODE") and __name__ != "__main__":
    # a process spawned by the suite (this module re-imported as __mp_main__)
    build()


# ---------------------------------------------------------------------- running


def _write(out: str | None, outcomes: dict[str, dict], done: bool) -> dict[str, int]:
    counts = {k: sum(1 for o in outcomes.values() if o["outcome"] == k)
              for k in ("passed", "failed", "skipped")}
    if out:
        tmp = out + ".part"
        with open(tmp, "w") as f:
            json.dump({"mode": os.environ["MINIDIST_SUITE_MODE"],
                       "world_size": int(os.environ["WORLD_SIZE"]), "complete": done,
                       "counts": counts, "tests": outcomes}, f, indent=1)
        os.replace(tmp, out)
    return counts


class _Result(unittest.TextTestResult):
    out: str | None = None  # where the outcomes so far are kept, after every test

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict] = {}
        self._start = 0.0

    def _put(self, test, outcome, detail=""):
        self.outcomes[test._testMethodName] = {
            "outcome": outcome, "detail": detail,
            "seconds": round(time.monotonic() - self._start, 2)}
        _write(self.out, self.outcomes, False)

    def startTest(self, test):  # noqa: N802
        self._start = time.monotonic()
        super().startTest(test)

    def addSuccess(self, test):  # noqa: N802
        super().addSuccess(test)
        self._put(test, "passed")

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._put(test, "failed", self._exc_info_to_string(err, test)[-6000:])

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._put(test, "failed", self._exc_info_to_string(err, test)[-6000:])

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._put(test, "skipped", str(reason))

    def addExpectedFailure(self, test, err):  # noqa: N802
        super().addExpectedFailure(test, err)
        self._put(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test):  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._put(test, "failed", "unexpected success")


def run(names: list[str] | None, out: str | None, verbosity: int = 2,
        match: list[str] | None = None) -> dict[str, dict]:
    cls = build()
    loader = unittest.TestLoader()
    all_names = loader.getTestCaseNames(cls)
    if names:
        unknown = [n for n in names if n not in all_names]
        if unknown:
            raise SystemExit(f"not in the suite: {unknown}")
    if names or match:
        selected = [n for n in all_names if n in (names or ())
                    or any(m in n for m in match or ())]
    else:
        selected = list(all_names)
    suite = unittest.TestSuite(cls(n) for n in selected)
    _Result.out = out
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=verbosity,
                                     resultclass=_Result)
    result = runner.run(suite)
    outcomes = result.outcomes
    for n in selected:  # a test that did not report (should not happen)
        outcomes.setdefault(n, {"outcome": "failed", "detail": "no result", "seconds": 0})
    counts = _write(out, outcomes, True)
    print(f"SUITE mode={os.environ['MINIDIST_SUITE_MODE']} "
          f"world_size={os.environ['WORLD_SIZE']} " +
          " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("-k", "--test", action="append", dest="tests",
                   help="run only this test (repeatable); default: the whole suite")
    p.add_argument("--match", action="append",
                   help="run the tests whose names contain this (repeatable)")
    p.add_argument("--default", action="store_true",
                   help="run the subset the default test run takes for this mode "
                   "(DEFAULT; meant for world size 2)")
    p.add_argument("--quick", action="store_true",
                   help="run the representative selection for this mode and world size")
    p.add_argument("--json", help="write the outcome of every test to this file")
    p.add_argument("--start", choices=("fork", "spawn"), default="fork",
                   help="how the ranks of a test start: fork (copies of this process, "
                   "the default: a test takes a second or two) or spawn (fresh "
                   "interpreters, as upstream's test_distributed_spawn.py starts them: "
                   "several times slower)")
    p.add_argument("--no-skips", action="store_true",
                   help="run the tests listed in SKIPS as well")
    args = p.parse_args(argv)
    if args.no_skips:
        os.environ["MINIDIST_SUITE_NO_SKIPS"] = "1"
    os.environ["MINIDIST_SUITE_START"] = args.start
    _environment(args.mode, args.world_size)
    names = list(args.tests or [])
    if args.default:
        names += DEFAULT.get(args.mode, ())
    if args.quick:
        names += QUICK.get((args.mode, args.world_size), ())
    outcomes = run(names or None, args.json, match=args.match)
    return 1 if any(o["outcome"] == "failed" for o in outcomes.values()) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(2)
