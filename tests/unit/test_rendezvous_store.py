"""The key/value store's requests without sockets: typed messages and the JSON objects
the door hands a world of one get the same replies; a wait past its deadline."""

from __future__ import annotations

import asyncio

import pytest

from minidist import messages as m
from minidist.errors import ProtocolError
from minidist.rendezvous.store import KeyValueStore


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_every_request_is_answered():
    async def main() -> None:
        s = KeyValueStore()
        assert (await s.answer(m.KvSet(key="a", id=1, value=b"x"))) == m.Reply(id=1)
        assert (await s.answer(m.KvGet(key="a", id=2))).data == b"x"
        assert (await s.answer(m.KvAdd(key="n", amount=5, id=3))).value == 5
        assert (await s.answer(m.KvAdd(key="n", id=3))).value == 6
        assert (await s.answer(m.KvWait(keys=["a", "n"], id=4))) == m.Reply(id=4)
        assert (await s.answer(m.KvCheck(keys=["a", "zz"], id=5))).ok is False
        cas = m.KvCompareSet(key="a", expected="x", id=6, desired=b"y")
        assert (await s.answer(cas)).data == b"y"
        assert (await s.answer(m.KvNumKeys(id=7))).value == 2
        assert (await s.answer(m.KvDelete(key="a", id=8))).ok is True
        assert (await s.answer(m.KvDelete(key="a", id=9))).ok is False

    run(main())


def test_the_doors_json_objects_get_the_same_replies():
    async def main() -> None:
        s = KeyValueStore()
        fields, value = await s.serve({"t": "kv_set", "key": "a", "timeout": 3.0}, b"v")
        assert value == b""
        fields, value = await s.serve({"t": "kv_get", "key": "a", "timeout": 3.0})
        assert value == b"v"
        fields, _ = await s.serve(m.KvAdd(key="n", amount=2).body)
        assert fields["value"] == 2

    run(main())


def test_a_wait_past_its_deadline():
    async def main() -> None:
        s = KeyValueStore()
        await s.set("a", b"1")
        with pytest.raises(TimeoutError):
            await s.serve({"t": "kv_wait", "keys": ["a", "b"], "timeout": 0.05})
        reply = await s.reply(m.KvWait(keys=["a", "b"], timeout=0.05, id=4))
        assert reply == m.Reply(id=4, timeout=True,
                                error="store keys not set within 0.05 s: ['b']")
        reply = await s.reply(m.KvGet(key="c", timeout=0.05, id=5))
        assert reply.timeout and "['c']" in reply.error

    run(main())


def test_what_is_no_key_value_request_is_refused():
    async def main() -> None:
        s = KeyValueStore()
        with pytest.raises(ValueError, match="unknown key/value request 'bye'"):
            await s.answer(m.Bye())
        with pytest.raises(ProtocolError, match="lacks its field 'key'"):
            await s.serve({"t": "kv_get"})

    run(main())
