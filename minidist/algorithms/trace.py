"""A simulated call as a Chrome / Perfetto trace (the JSON "Trace Event Format").

:func:`chrome_trace` turns a :class:`~minidist.algorithms.cost.Replay` recorded with
``record=True`` into a dict ready for ``json.dump``: one process per node, one thread
per rank, a slice for every send, receive, reduction and copy (with its step, peer,
tag and bytes), and a flow arrow from each send to the receive that takes it in. Open
the file in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .cost import Costs, Replay

__all__ = ["chrome_trace"]


def chrome_trace(rep: Replay, *, title: str, nodes: Sequence[int] | None = None,
                 costs: Costs | None = None) -> dict[str, Any]:
    """The trace of a recorded replay (times in microseconds, as the format wants)."""
    n = len(rep.finish)
    node = tuple(nodes) if nodes is not None else (0,) * n
    us = 1e6
    events: list[dict[str, Any]] = []
    for nd in sorted(set(node)):
        events.append({"ph": "M", "name": "process_name", "pid": nd, "tid": 0,
                       "args": {"name": f"node {nd}" if len(set(node)) > 1 else title}})
    for r in range(n):
        events.append({"ph": "M", "name": "thread_name", "pid": node[r], "tid": r,
                       "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": node[r], "tid": r,
                       "args": {"sort_index": r}})
    for e in rep.events:
        if e.kind == "send":
            name = f"send to {e.peer}"
        elif e.kind == "recv":
            name = f"recv from {e.peer}"
        else:
            name = e.kind
        args: dict[str, Any] = {"step": e.step, "bytes": e.nbytes}
        if e.peer >= 0:
            args.update(peer=e.peer, tag=e.tag)
        if e.detail:
            args["elements"] = e.detail
        events.append({"ph": "X", "name": name, "cat": e.kind, "pid": node[e.rank],
                       "tid": e.rank, "ts": e.start * us,
                       "dur": max(0.0, (e.end - e.start) * us), "args": args})
    for i, m in enumerate(rep.flows):
        common = {"name": "message", "cat": "message", "id": i}
        events.append({**common, "ph": "s", "pid": node[m.src], "tid": m.src,
                       "ts": m.sent * us - 1e-3})
        events.append({**common, "ph": "f", "bp": "e", "pid": node[m.dst], "tid": m.dst,
                       "ts": m.taken * us + 1e-3})
    meta: dict[str, Any] = {"title": title, "predicted_us": rep.time * us,
                            "messages": rep.messages, "bytes_sent": rep.nbytes,
                            "bytes_reduced": rep.reduced, "bytes_copied": rep.copied}
    if costs is not None:
        meta["costs"] = costs.to_dict()
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": meta}
