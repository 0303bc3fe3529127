"""Traces of real runs: ``MINIDIST_TRACE=DIR`` records what every rank's collectives did.

With ``MINIDIST_TRACE`` naming a directory, each rank keeps a :class:`Tracer` (the
engine holds it; without the variable the engine holds None and does nothing more than
look at it once per call). For every collective run through a schedule it records, with
wall-clock timestamps (``time.time_ns()``):

* a slice for the whole call (collective, algorithm, group, call number, bytes, path);
* a slice per step, and inside it a slice per local reduction or copy;
* a slice per send, from when it was posted to when the transport took it;
* an instant per receive, when its data had arrived (with when it was posted);
* a flow arrow from each send to the receive that took it in (same ids on both ranks).

Small calls of the shared-memory fast path are one slice each (no steps);
point-to-point messages are not recorded.

Events are kept in memory, the last :data:`MAX_EVENTS` of them (older ones are dropped
and counted), and written as a Chrome trace (``{"traceEvents": [...]}``) to
``DIR/<job>-rank<R>.json`` at ``destroy()`` and again at the process's exit.
:func:`merge` puts the files of one job into ``DIR/<job>.json``: ``minidist run`` does
it when the job ends, ``minidist trace merge DIR`` by hand. Timestamps are each host's
wall clock: on one host they line up exactly; across hosts they are only as close as
the hosts' clocks (NTP, PTP) — no offset is measured or corrected.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from . import env

MAX_EVENTS = 100_000  # per rank: the most recent events kept (older ones dropped)
_RANK_FILE = re.compile(r"^(?P<job>.+)-rank(?P<rank>\d+)\.json$")

_tracers: dict[tuple[str, str, int], Tracer] = {}


def from_env(environ: Mapping[str, str], job: str, rank: int) -> Tracer | None:
    """This rank's tracer when ``MINIDIST_TRACE`` is set, else None. One per process,
    job and rank: a second ``init()`` of the same job adds to the same file."""
    directory = env.trace_dir(environ)
    if directory is None:
        return None
    directory = os.path.abspath(directory)
    key = (directory, job, rank)
    t = _tracers.get(key)
    if t is None:
        t = _tracers[key] = Tracer(directory, job, rank)
        atexit.register(t.flush)
    return t


def flow_id(group: int, seq: int, src: int, dst: int, tag: int) -> int:
    """The id of a message's flow arrow: the same on its sender and its receiver."""
    digest = hashlib.blake2b(f"{group}:{seq}:{src}:{dst}:{tag}".encode(), digest_size=8)
    return int.from_bytes(digest.digest()) >> 11  # 53 bits: exact in any JSON reader


class Tracer:
    """One rank's recorded events (append from any thread)."""

    def __init__(self, directory: str, job: str, rank: int,
                 max_events: int = MAX_EVENTS) -> None:
        self.dir = directory
        self.job = job
        self.rank = rank
        self.path = os.path.join(directory, f"{job}-rank{rank}.json")
        self.events: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=max_events)
        self.appended = 0
        self.now = time.time_ns
        self._meta: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
             "args": {"name": f"rank {rank}"}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
             "args": {"sort_index": rank}}]
        self._tids: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()  # new tracks (the fast path's thread names some)
        self._pid = os.getpid()  # a forked child's exit writes nothing for this rank

    def tid(self, group: Any, track: str = "calls") -> int:
        """The thread id of ``group``'s ``track`` ("calls", "sends", "fast path")."""
        key = (group.id, track)
        t = self._tids.get(key)
        if t is not None:
            return t
        with self._lock:
            if key in self._tids:
                return self._tids[key]
            t = self._tids[key] = len(self._tids) + 1
            where = "world" if group.id == 0 else (
                group.name or f"group {group.id:#x} {list(group.ranks)}")
            self._meta.append({"ph": "M", "name": "thread_name", "pid": self.rank,
                               "tid": t, "args": {"name": f"{where}: {track}"}})
            self._meta.append({"ph": "M", "name": "thread_sort_index", "pid": self.rank,
                               "tid": t, "args": {"sort_index": t}})
        return t

    def span(self, name: str, cat: str, tid: int, start_ns: int, end_ns: int,
             args: dict[str, Any]) -> None:
        self.appended += 1
        self.events.append({"ph": "X", "name": name, "cat": cat, "pid": self.rank,
                            "tid": tid, "ts": start_ns / 1e3,
                            "dur": max(0, end_ns - start_ns) / 1e3, "args": args})

    def instant(self, name: str, cat: str, tid: int, ts_ns: int,
                args: dict[str, Any]) -> None:
        self.appended += 1
        self.events.append({"ph": "i", "s": "t", "name": name, "cat": cat,
                            "pid": self.rank, "tid": tid, "ts": ts_ns / 1e3, "args": args})

    def flow(self, start: bool, fid: int, tid: int, ts_ns: int) -> None:
        """One end of a message's arrow: its send (``start``) or its arrival."""
        self.appended += 1
        e = {"ph": "s" if start else "f", "name": "message", "cat": "message", "id": fid,
             "pid": self.rank, "tid": tid, "ts": ts_ns / 1e3}
        if not start:
            e["bp"] = "e"
        self.events.append(e)

    def document(self) -> dict[str, Any]:
        return {"traceEvents": [*self._meta, *self.events], "displayTimeUnit": "ns",
                "otherData": {"job": self.job, "rank": self.rank, "pid": os.getpid(),
                              "host": socket.gethostname(), "clock": "time.time_ns",
                              "events": len(self.events),
                              "dropped": self.appended - len(self.events),
                              "max_events": self.events.maxlen}}

    def flush(self) -> None:
        """Write this rank's file (whole, replacing an earlier one); nothing in a child
        forked from the rank."""
        if os.getpid() != self._pid:
            return
        try:
            os.makedirs(self.dir, exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.document(), f)
            os.replace(tmp, self.path)
        except OSError as e:  # a trace must never fail the job
            import logging

            logging.getLogger("minidist.tracing").warning(
                "could not write the trace %s: %s", self.path, e)


# ---------------------------------------------------------------------- merging


def rank_files(directory: str) -> dict[str, dict[int, str]]:
    """The per-rank files in ``directory``: job -> rank -> path."""
    out: dict[str, dict[int, str]] = {}
    for name in sorted(os.listdir(directory)):
        m = _RANK_FILE.match(name)
        if m:
            out.setdefault(m["job"], {})[int(m["rank"])] = os.path.join(directory, name)
    return out


def merge(directory: str, job: str | None = None, out: str | None = None) -> list[str]:
    """Merge each job's rank files in ``directory`` into one Chrome trace (``job``: only
    that one; ``out``: the merged file's path, for one job only, else
    ``DIR/<job>.json``). Timestamps become microseconds since the job's first event
    (which ``otherData.t0_unix_us`` gives). Returns the files written."""
    jobs = rank_files(directory)
    if job is not None:
        jobs = {job: jobs[job]} if job in jobs else {}
    if not jobs:
        raise FileNotFoundError(f"no trace files (<job>-rank<R>.json) in {directory}"
                                + (f" for job {job}" if job else ""))
    if out is not None and len(jobs) > 1:
        raise ValueError(f"{directory} holds the traces of {len(jobs)} jobs "
                         f"({', '.join(sorted(jobs))}): choose one with --job")
    written = []
    for name, files in sorted(jobs.items()):
        path = out or os.path.join(directory, f"{name}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(merge_files(name, files), f)
        os.replace(path + ".tmp", path)
        written.append(path)
    return written


def merge_files(job: str, files: dict[int, str]) -> dict[str, Any]:
    """One job's trace from its rank files (rank -> path); unreadable files are
    skipped and named in ``otherData.unreadable``."""
    docs, unreadable = {}, []
    for rank, path in sorted(files.items()):
        try:
            with open(path) as f:
                docs[rank] = json.load(f)
        except (OSError, ValueError):
            unreadable.append(path)
    stamped = [e["ts"] for d in docs.values() for e in d.get("traceEvents", ())
               if e.get("ph") != "M"]
    t0 = min(stamped, default=0.0)
    events: list[dict[str, Any]] = []
    for d in docs.values():
        for e in d.get("traceEvents", ()):
            if e.get("ph") != "M":
                e = {**e, "ts": round(e["ts"] - t0, 3)}
            events.append(e)
    meta = {"job": job, "ranks": sorted(docs), "t0_unix_us": t0,
            "clock": "each host's wall clock (time.time_ns); not corrected across hosts",
            "hosts": {r: d.get("otherData", {}).get("host") for r, d in docs.items()},
            "dropped": {r: d.get("otherData", {}).get("dropped", 0)
                        for r, d in docs.items()}}
    if unreadable:
        meta["unreadable"] = unreadable
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": meta}
