"""The control-message catalog, byte by byte: every message encodes to the bytes the
dicts written out by hand used to make (so ranks of either version understand each
other), reads back as itself, and a message of no known type or without a field it
needs is a clear ProtocolError. Also the abort kinds and the stream decoder."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from minidist import messages as m
from minidist import wire
from minidist.errors import (
    AbortKind,
    CollectiveMismatchError,
    DistTimeoutError,
    PeerLostError,
    ProtocolError,
    RendezvousError,
)
from minidist.rendezvous.control import ControlReader

# (the typed message, the JSON object the code before the catalog wrote for it, blob):
# the objects are written as that code wrote them, key order included
GOLDEN = [
    (m.Register(rank=3, world_size=8, local_rank=1, node="h/42", pid=77, reads=None),
     {"t": "register", "rank": 3, "world_size": 8, "local_rank": 1, "node": "h/42",
      "pid": 77, "reads": None}, b""),
    (m.Joined(id=5), {"t": "joined", "id": 5}, b""),
    (m.Bye(), {"t": "bye"}, b""),
    # the store's requests: kvstore's object, the door's timeout, the client's id
    (m.KvSet(key="k", timeout=30.0, id=1, value=b"\x00v"),
     {"t": "kv_set", "key": "k", "timeout": 30.0, "id": 1}, b"\x00v"),
    (m.KvGet(key="k", timeout=30.0, id=2), {"t": "kv_get", "key": "k", "timeout": 30.0,
                                            "id": 2}, b""),
    (m.KvAdd(key="n", amount=3, timeout=30.0, id=3),
     {"t": "kv_add", "key": "n", "amount": 3, "timeout": 30.0, "id": 3}, b""),
    (m.KvWait(keys=["a", "b"], timeout=1.5, id=4),
     {"t": "kv_wait", "keys": ["a", "b"], "timeout": 1.5, "id": 4}, b""),
    (m.KvCheck(keys=["a"], timeout=30.0, id=5),
     {"t": "kv_check", "keys": ["a"], "timeout": 30.0, "id": 5}, b""),
    (m.KvDelete(key="a", timeout=30.0, id=6),
     {"t": "kv_delete", "key": "a", "timeout": 30.0, "id": 6}, b""),
    (m.KvNumKeys(timeout=30.0, id=7), {"t": "kv_num_keys", "timeout": 30.0, "id": 7}, b""),
    (m.KvCompareSet(key="a", expected="\xff", timeout=30.0, id=8, desired=b"new"),
     {"t": "kv_compare_set", "key": "a", "expected": "\xff", "timeout": 30.0, "id": 8},
     b"new"),
    (m.Stalled(group=9, seq=4, sig=["all_reduce", 1, 0, 0, -1, 4, 0],
               call="all_reduce(4 x float32)", where="Group(world)", ranks=[0, 1]),
     {"t": "stalled", "group": 9, "seq": 4, "sig": ["all_reduce", 1, 0, 0, -1, 4, 0],
      "call": "all_reduce(4 x float32)", "where": "Group(world)", "ranks": [0, 1]}, b""),
    # a rank's aborts, one of each kind
    (m.Abort(ranks=[0, 1, 2], group=9, seq=4, reason="boom", kind=AbortKind.MISMATCH),
     {"t": "abort", "ranks": [0, 1, 2], "group": 9, "seq": 4, "reason": "boom",
      "kind": "mismatch"}, b""),
    (m.Abort(ranks=[0, 1], group=9, seq=4, reason="died", kind=AbortKind.LOST, lost=[1],
             left=False),
     {"t": "abort", "ranks": [0, 1], "group": 9, "seq": 4, "reason": "died",
      "kind": "lost", "lost": [1], "left": False}, b""),
    (m.Abort(ranks=[0, 1], group=9, seq=4, reason="late", kind=AbortKind.TIMEOUT,
             missing=[1]),
     {"t": "abort", "ranks": [0, 1], "group": 9, "seq": 4, "reason": "late",
      "kind": "timeout", "missing": [1]}, b""),
    # as the rendezvous forwards them: without ranks, with by
    (m.Abort(group=9, seq=4, reason="died", kind=AbortKind.LOST, lost=[1], left=True,
             by=0),
     {"t": "abort", "group": 9, "seq": 4, "reason": "died", "kind": "lost", "lost": [1],
      "left": True, "by": 0}, b""),
    (m.Abort(group=9, seq=4, reason="mismatch found", kind=AbortKind.MISMATCH, by=-1),
     {"t": "abort", "group": 9, "seq": 4, "reason": "mismatch found",
      "kind": "mismatch", "by": -1}, b""),
    (m.Progress(group=9, ranks=[0, 1], id=11),
     {"t": "progress", "group": 9, "ranks": [0, 1], "id": 11}, b""),
    (m.QueryReply(qid=3, entered=12), {"t": "query_reply", "qid": 3, "entered": 12}, b""),
    (m.Agree(kind="shrink", group=9, seq=0, runs=[[0, 3]], exclude=[2], flag=True,
             incarnations={"1": 2}, id=12),
     {"t": "agree", "kind": "shrink", "group": 9, "seq": 0, "runs": [[0, 3]],
      "exclude": [2], "flag": True, "incarnations": {"1": 2}, "id": 12}, b""),
    (m.Welcome(world_size=2, nodes=[0, 1], agents=[[None, 2950], ["10.0.0.2", 2950]],
               reads=[None, "key"]),
     {"t": "welcome", "world_size": 2, "nodes": [0, 1],
      "agents": [[None, 2950], ["10.0.0.2", 2950]], "reads": [None, "key"]}, b""),
    # a restarted rank's welcome
    (m.Welcome(world_size=2, nodes=[0, 0], agents=[[None, 2950]], reads=[None, None],
               incarnations=[0, 1], lost={"0": "killed"}, left=[]),
     {"t": "welcome", "world_size": 2, "nodes": [0, 0], "agents": [[None, 2950]],
      "reads": [None, None], "incarnations": [0, 1], "lost": {"0": "killed"},
      "left": []}, b""),
    (m.Error(msg="already registered"), {"t": "error", "msg": "already registered"}, b""),
    (m.Error(retry=True, msg="shutting down"),
     {"t": "error", "retry": True, "msg": "shutting down"}, b""),
    (m.Error(msg="rank 1 died", lost=[1]), {"t": "error", "msg": "rank 1 died",
                                            "lost": [1]}, b""),
    # replies: a store value, a count, a check, a timeout, progress, an agreement
    (m.Reply(id=2, data=b"value"), {"t": "reply", "id": 2}, b"value"),
    (m.Reply(id=3, value=4), {"t": "reply", "id": 3, "value": 4}, b""),
    (m.Reply(id=5, ok=False), {"t": "reply", "id": 5, "ok": False}, b""),
    (m.Reply(id=4, timeout=True, error="store keys not set within 1.5 s: ['b']"),
     {"t": "reply", "id": 4, "timeout": True,
      "error": "store keys not set within 1.5 s: ['b']"}, b""),
    (m.Reply(id=11, entered={"0": 5, "1": None}, lost=[]),
     {"t": "reply", "id": 11, "entered": {"0": 5, "1": None}, "lost": []}, b""),
    (m.Reply(id=12, value=True, excluded=[2], gone=[], epoch=1),
     {"t": "reply", "id": 12, "value": True, "excluded": [2], "gone": [], "epoch": 1}, b""),
    (m.Reply(id=None, error="bad agreement request"),
     {"t": "reply", "id": None, "error": "bad agreement request"}, b""),
    (m.Lost(rank=1, reason="killed"), {"t": "lost", "rank": 1, "reason": "killed"}, b""),
    (m.Left(ranks=[1, 2]), {"t": "left", "ranks": [1, 2]}, b""),
    (m.Back(rank=1, incarnation=2), {"t": "back", "rank": 1, "incarnation": 2}, b""),
    (m.Query(qid=3, group=9), {"t": "query", "qid": 3, "group": 9}, b""),
    (m.AgentHello(node="h/42", host="10.0.0.2", port=2950),
     {"t": "agent_hello", "node": "h/42", "host": "10.0.0.2", "port": 2950}, b""),
    (m.Heartbeat(), {"t": "hb"}, b""),
    (m.Gone(via=4), {"t": "gone", "via": 4}, b""),
]


def test_every_message_of_the_catalog_has_a_golden_case():
    assert {g[0].type for g in GOLDEN} == set(m.CATALOG)


@pytest.mark.parametrize("msg,body,blob", GOLDEN, ids=lambda x: getattr(x, "type", ""))
def test_a_message_makes_the_bytes_of_its_old_dict(msg, body, blob):
    assert msg.encode() == wire.encode_control(body, blob)
    assert msg.body == body and list(msg.body) == list(body)
    assert msg.blob == blob


@pytest.mark.parametrize("msg,body,blob", GOLDEN, ids=lambda x: getattr(x, "type", ""))
def test_a_message_reads_back_as_itself(msg, body, blob):
    dec = wire.ControlDecoder()
    got = []
    for byte in msg.encode():  # one byte at a time
        got += dec.feed(bytes([byte]))
    assert len(got) == 1
    back = m.decode(got[0])
    assert back == msg and type(back) is type(msg)
    assert back.encode() == msg.encode()
    assert m.parse(body, blob) == msg


def test_an_unknown_type_is_a_clear_error():
    with pytest.raises(m.UnknownMessageError, match="unknown control message type 'nope'"):
        m.decode(wire.Control({"t": "nope", "x": 1}))
    for body in ({}, {"t": 3}, {"t": None}):
        with pytest.raises(ProtocolError, match="unknown control message type"):
            m.parse(body)
    assert issubclass(m.UnknownMessageError, ProtocolError)


@pytest.mark.parametrize("body,field", [
    ({"t": "kv_set"}, "key"),
    ({"t": "kv_compare_set", "key": "a"}, "expected"),
    ({"t": "lost", "reason": "x"}, "rank"),
    ({"t": "abort", "group": 1, "reason": "x"}, "seq"),
    ({"t": "stalled", "group": 1, "seq": 2, "sig": [], "call": "c", "where": "w"}, "ranks"),
    ({"t": "welcome", "world_size": 2}, "nodes"),
    ({"t": "gone"}, "via"),
])
def test_a_missing_field_is_a_clear_error(body, field):
    with pytest.raises(ProtocolError, match=f"{body['t']!r} lacks its field {field!r}"):
        m.parse(body)


def test_fields_with_defaults_may_be_absent_and_unknown_keys_are_ignored():
    assert m.parse({"t": "lost", "rank": 2}) == m.Lost(rank=2, reason="")
    assert m.parse({"t": "kv_add", "key": "n", "new": 1}) == m.KvAdd(key="n", amount=1)
    assert m.parse({"t": "error"}).msg == "refused"
    assert m.parse({"t": "register"}).rank == -1
    # an abort of a kind this version does not know still ends the call, as a mismatch
    a = m.parse({"t": "abort", "group": 1, "seq": 2, "reason": "r", "kind": "future"})
    assert a.kind is AbortKind.MISMATCH


def test_routes_are_added_last_and_taken_off():
    raw = m.encode(m.Lost(rank=1, reason="x"), to=7)
    assert raw == wire.encode_control({"t": "lost", "rank": 1, "reason": "x", "to": 7})
    control = wire.ControlDecoder().feed(m.encode(m.KvSet(key="k", id=1, value=b"v"),
                                                  via=3))[0]
    cid, rest = m.unroute(control, "via")
    assert cid == 3 and rest.body == {"t": "kv_set", "key": "k", "id": 1}
    assert rest.blob == b"v" and "via" in control.body  # the message read is unchanged
    assert m.unroute(rest, "via") == (None, rest)
    with pytest.raises(ValueError, match="not a route"):
        m.encode(m.Bye(), id=3)


def test_a_message_reads_like_its_json_object():
    r = m.Reply(id=3, excluded=[1], gone=[])
    assert r["excluded"] == [1] and r.get("value") is None and r.type == "reply"
    with pytest.raises(KeyError):
        r["value"]  # noqa: B018


# ------------------------------------------------------------------------- abort kinds

@pytest.mark.parametrize("exc,kind", [
    (PeerLostError("gone", ranks=[2, 1], left=True), AbortKind.LOST),
    (DistTimeoutError("late", missing=[3]), AbortKind.TIMEOUT),
    (CollectiveMismatchError("differs"), AbortKind.MISMATCH),
    (RuntimeError("anything else"), AbortKind.MISMATCH),
])
def test_an_error_travels_as_its_kind_and_comes_back_as_its_class(exc, kind):
    a = m.Abort.of_error(exc, group=9, seq=4, ranks=[0, 1, 2])
    assert a.kind is kind and a.ranks == [0, 1, 2] and a.reason == str(exc)
    back = m.decode(wire.ControlDecoder().feed(a.encode())[0])
    err = back.error()
    assert type(err) is kind.error_class and str(err) == str(exc)
    if kind is AbortKind.LOST:
        assert err.ranks == (1, 2) and err.left is True
    if kind is AbortKind.TIMEOUT:
        assert err.missing == (3,)


def test_every_abort_kind_has_one_error_class():
    assert {k.error_class for k in AbortKind} == {CollectiveMismatchError, PeerLostError,
                                                  DistTimeoutError}
    assert AbortKind.parse("lost") is AbortKind.LOST
    assert AbortKind.parse("no such kind") is AbortKind.MISMATCH


def test_a_forwarded_timeout_names_the_rank_that_reported_it():
    a = m.Abort(group=1, seq=2, reason="late", kind=AbortKind.TIMEOUT, missing=[3], by=0)
    assert str(a.error()) == "late (reported by rank 0)"


def test_refusals_and_error_replies_raise_what_register_and_request_raise():
    err = m.Error(msg="rank 1 died", lost=[1]).exception()
    assert isinstance(err, PeerLostError) and err.ranks == (1,) and err.retry is False
    err = m.Error(retry=True, msg="later").exception()
    assert type(err) is RendezvousError and err.retry is True
    assert isinstance(m.Reply(id=1, timeout=True, error="late").exception(),
                      DistTimeoutError)
    assert type(m.Reply(id=1, error="no").exception()) is RendezvousError
    assert m.Reply(id=1, value=3).exception() is None


# ------------------------------------------------------------------- reading streams

def test_the_decoder_returns_the_messages_before_garbage_first():
    dec = wire.ControlDecoder()
    dec.add(m.Bye().encode() + b"GET / HTTP/1.1\r\n\r\n")
    assert m.decode(dec.next_message()) == m.Bye()
    with pytest.raises(ProtocolError, match="control magic"):
        dec.next_message()


def test_the_decoder_says_how_many_bytes_it_still_wants():
    raw = m.KvSet(key="k", value=bytes(1000)).encode()
    dec = wire.ControlDecoder()
    assert dec.wanted() == wire.CONTROL_HEADER_SIZE
    dec.add(raw[:20])
    assert dec.next_message() is None and dec.wanted() == len(raw) - 20
    dec.add(raw[20:])
    assert dec.next_message().blob == bytes(1000) and dec.pending() == b""


def test_a_large_message_in_many_chunks_then_more_in_the_last_one():
    big = m.KvSet(key="k", id=1, value=bytes(range(256)) * 4000)
    raw = big.encode() + m.Bye().encode() + m.Lost(rank=1).encode()[:5]
    dec = wire.ControlDecoder()
    got = []
    for i in range(0, len(raw), 999):
        got += dec.feed(raw[i:i + 999])
    assert [m.decode(x) for x in got] == [big, m.Bye()]
    assert dec.pending() == m.Lost(rank=1).encode()[:5]
    assert m.decode(dec.feed(m.Lost(rank=1).encode()[5:])[0]) == m.Lost(rank=1)
    assert dec.pending() == b""


def test_the_stream_reader_reads_fragments_and_ends_with_an_incomplete_read():
    async def main() -> None:
        reader = asyncio.StreamReader()
        stream = ControlReader(reader)
        raw = b"".join(x[0].encode() for x in GOLDEN)
        for i in range(0, len(raw), 5):
            reader.feed_data(raw[i:i + 5])
        reader.feed_data(raw[:7])  # half a header, then the end
        reader.feed_eof()
        got = [m.decode(await asyncio.wait_for(stream.read(), 5)) for _ in GOLDEN]
        assert got == [x[0] for x in GOLDEN]
        with pytest.raises(asyncio.IncompleteReadError):
            await asyncio.wait_for(stream.read(), 5)

    asyncio.run(main())


def test_the_catalog_is_pure():
    """Like the wire: no socket, no asyncio, nothing above it."""
    tree = ast.parse(Path(m.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.module in (None, "errors"), f"messages imports .{node.module}"
                assert node.module or {a.name for a in node.names} == {"wire"}
                continue
            names = [node.module or ""]
        else:
            continue
        for name in names:
            assert name.split(".")[0] not in {"socket", "asyncio", "threading", "selectors",
                                              "os"}, name
