"""The job's key/value store as users see it (like torch's TCPStore): one set of
requests, answered through the door, blocking (:class:`Store`) or awaitable
(:class:`AsyncStore`)."""

from __future__ import annotations

from typing import Any

from . import messages
from .door import Door


def _b(v: bytes | str) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


class _Requests:
    """The store's requests; ``_ask`` answers them (a value, or a coroutine of one)."""

    def __init__(self, d: Door) -> None:
        self._door = d

    def _ask(self, request: messages.Message, timeout: float | None = None,
             field: str | None = None) -> Any:
        raise NotImplementedError

    def set(self, key: str, value: bytes | str) -> Any:
        """Set ``key`` to ``value``, waking every rank waiting for it."""
        return self._ask(messages.KvSet(key=key, value=_b(value)))

    def get(self, key: str, timeout: float | None = None) -> Any:
        """The value of ``key`` (bytes), waiting for it (DistTimeoutError past the
        deadline)."""
        return self._ask(messages.KvGet(key=key), timeout=timeout)

    def add(self, key: str, amount: int = 1) -> Any:
        """Add to the integer counter ``key`` (created at 0); its new value."""
        return self._ask(messages.KvAdd(key=key, amount=int(amount)), field="value")

    def wait(self, keys: list[str], timeout: float | None = None) -> Any:
        """Return once every key is set (DistTimeoutError past the deadline)."""
        return self._ask(messages.KvWait(keys=list(keys)), timeout=timeout, field="-")

    def check(self, keys: list[str]) -> Any:
        """True if every key is set (never waits)."""
        return self._ask(messages.KvCheck(keys=list(keys)), field="ok")

    def delete_key(self, key: str) -> Any:
        """Remove ``key``; True if it existed."""
        return self._ask(messages.KvDelete(key=key), field="ok")

    def num_keys(self) -> Any:
        """How many keys are set."""
        return self._ask(messages.KvNumKeys(), field="value")

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> Any:
        """Set ``key`` to ``desired`` if it holds ``expected``; its value afterwards."""
        return self._ask(messages.KvCompareSet(key=key, expected=_b(expected).decode("latin-1"),
                                               desired=_b(desired)))


def _pick(reply: tuple[dict[str, Any], bytes], field: str | None) -> Any:
    fields, value = reply
    return value if field is None else fields.get(field)


class Store(_Requests):
    """The job's key/value store, blocking; values are bytes."""

    def _ask(self, request: messages.Message, timeout: float | None = None,
             field: str | None = None) -> Any:
        return _pick(self._door.block(self._door.store_request(request.body, request.blob,
                                                               timeout)), field)


class AsyncStore(_Requests):
    """The job's key/value store for :mod:`minidist.aio`: every method is awaited."""

    async def _ask(self, request: messages.Message, timeout: float | None = None,
                   field: str | None = None) -> Any:
        return _pick(await self._door.store_request(request.body, request.blob, timeout),
                     field)
