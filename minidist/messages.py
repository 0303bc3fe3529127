"""The control messages: one typed definition per message of the control plane (rank,
node agent and rendezvous), and how each travels. Pure: no sockets, no asyncio.

A message is a frozen dataclass whose fields are the keys of the JSON object the wire
carries (:func:`minidist.wire.encode_control`), in the order they are written, after
``"t"``, the message's :attr:`Message.TYPE`. A field without a default must be present
when a message is read; a field made with :func:`optional` is left out of the JSON while
it is None; a field made with :func:`blob_field` travels as the message's binary blob. Keys a
message does not define are ignored when it is read, so a newer peer may add some.

Between a node agent and the rendezvous a rank's message carries one more key, its
*route*: ``"via"`` (the agent's id for the rank's connection, on the way up) or ``"to"``
(the same id, on the way down); :func:`encode` adds it and :func:`unroute` takes it off.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from . import wire
from .errors import (
    AbortKind,
    DistError,
    DistTimeoutError,
    PeerLostError,
    ProtocolError,
    RendezvousError,
)

ROUTES = ("via", "to")  # the keys an agent and the rendezvous add to a rank's messages


class UnknownMessageError(ProtocolError):
    """A control message of a type this version does not define."""


# ---------------------------------------------------------------------------- fields

_OMIT = "omit"  # metadata: left out of the JSON while None
_BLOB = "blob"  # metadata: the message's binary blob
_PARSE = "parse"  # metadata: turns the JSON value into the field's value


def optional() -> Any:
    """A field that may be absent: None, and left out of the JSON while it is None."""
    return dataclasses.field(default=None, metadata={_OMIT: True})


def blob_field() -> Any:
    """The field that travels as the message's binary blob (b"" when there is none)."""
    return dataclasses.field(default=b"", metadata={_BLOB: True})


def _parsed(default: Any, parse: Callable[[Any], Any]) -> Any:
    return dataclasses.field(default=default, metadata={_PARSE: parse})


class Message:
    """Base of every control message. It reads like :class:`minidist.wire.Control`:
    :attr:`body` (the JSON object), :attr:`blob` (the bytes) and :attr:`type`."""

    __slots__ = ()
    TYPE: ClassVar[str] = ""
    # (name, left out while None, is the blob, parse), in wire order; set by @message
    _SPEC: ClassVar[tuple[tuple[str, bool, bool, Callable[[Any], Any] | None], ...]] = ()
    _REQUIRED: ClassVar[frozenset[str]] = frozenset()

    @property
    def type(self) -> str:
        return self.TYPE

    @property
    def body(self) -> dict[str, Any]:
        """The JSON object this message travels as (a new dict each time)."""
        out: dict[str, Any] = {"t": self.TYPE}
        for name, omit, is_blob, _ in self._SPEC:
            if is_blob:
                continue
            value = getattr(self, name)
            if value is None and omit:
                continue
            out[name] = value.value if isinstance(value, enum.Enum) else value
        return out

    @property
    def blob(self) -> bytes:
        for name, _, is_blob, _ in self._SPEC:
            if is_blob:
                return getattr(self, name)
        return b""

    def __getitem__(self, key: str) -> Any:
        """A key of :attr:`body` (KeyError if the message leaves it out)."""
        return self.body[key]

    def get(self, key: str, default: Any = None) -> Any:
        """A key of :attr:`body`, or ``default``."""
        return self.body.get(key, default)

    def encode(self) -> bytes:
        """The bytes of this message on the wire."""
        return wire.encode_control(self.body, self.blob)

    @classmethod
    def from_body(cls: type[M], body: Mapping[str, Any], blob: bytes = b"") -> M:
        """The message ``body`` (a JSON object of this type) and ``blob`` carry;
        ProtocolError naming the first required field that is missing."""
        missing = cls._REQUIRED.difference(body)
        if missing:
            name = next(n for n, *_ in cls._SPEC if n in missing)
            raise ProtocolError(f"control message {cls.TYPE!r} lacks its field {name!r}")
        kwargs: dict[str, Any] = {}
        for name, _, is_blob, conv in cls._SPEC:
            if is_blob:
                kwargs[name] = bytes(blob)
            elif name in body:
                kwargs[name] = body[name] if conv is None else conv(body[name])
        return cls(**kwargs)


M = TypeVar("M", bound=Message)
CATALOG: dict[str, type[Message]] = {}


def message(type_: str) -> Callable[[type[M]], type[M]]:
    """Define a control message of type ``type_``: a frozen, keyword-only dataclass,
    entered in :data:`CATALOG`."""
    def define(cls: type[M]) -> type[M]:
        if type_ in CATALOG:
            raise ValueError(f"control message {type_!r} defined twice")
        cls.TYPE = type_
        cls = dataclasses.dataclass(frozen=True, kw_only=True, slots=True)(cls)
        spec = []
        for f in dataclasses.fields(cls):
            if f.name == "t":
                raise ValueError(f"{cls.__name__}: {f.name!r} is not a field name")
            spec.append((f.name, bool(f.metadata.get(_OMIT)), bool(f.metadata.get(_BLOB)),
                         f.metadata.get(_PARSE)))
        cls._SPEC = tuple(spec)
        cls._REQUIRED = frozenset(
            f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        CATALOG[type_] = cls
        return cls
    return define


def parse(body: Mapping[str, Any], blob: bytes = b"") -> Message:
    """The typed message a JSON object and blob carry. UnknownMessageError (a
    ProtocolError) for a type the catalog does not define, ProtocolError for a missing
    field."""
    t = body.get("t")
    cls = CATALOG.get(t) if isinstance(t, str) else None
    if cls is None:
        raise UnknownMessageError(f"unknown control message type {body.get('t')!r}")
    return cls.from_body(body, blob)


def decode(control: wire.Control | Message) -> Message:
    """The typed message of a control message read off the wire (see :func:`parse`)."""
    if isinstance(control, Message):
        return control
    return parse(control.body, control.blob)


def encode(msg: Message | wire.Control, **route: int) -> bytes:
    """The bytes of ``msg`` (typed, or relayed as read), with a route key (``via=`` or
    ``to=``) added last if given."""
    if not route:
        return msg.encode() if isinstance(msg, Message) else \
            wire.encode_control(msg.body, msg.blob)
    if set(route) - set(ROUTES):
        raise ValueError(f"not a route: {sorted(set(route) - set(ROUTES))}")
    return wire.encode_control({**msg.body, **route}, msg.blob)


def unroute(control: wire.Control, key: str) -> tuple[int | None, wire.Control]:
    """(the route ``key`` names, the message without it) of a relayed message; the id
    is None if the message has none."""
    if key not in control.body:
        return None, control
    body = dict(control.body)
    return body.pop(key), wire.Control(body, control.blob)


# ---------------------------------------------------------------- rank -> rendezvous

@message("register")
class Register(Message):
    """A rank joins the job (``rank`` -1: any free rank). ``reads``: what a peer must
    share to read its memory (see :func:`minidist.peer_memory.key`)."""

    rank: Any = -1
    world_size: Any = None
    local_rank: Any = None
    node: Any = ""
    pid: Any = 0
    reads: Any = None


@message("joined")
class Joined(Message):
    """Which ranks have registered (asked when init times out); replied ``value``."""

    id: int | None = optional()


@message("bye")
class Bye(Message):
    """This rank is leaving on purpose."""


@message("kv_set")
class KvSet(Message):
    key: str
    timeout: float | None = optional()
    id: int | None = optional()
    value: bytes = blob_field()


@message("kv_get")
class KvGet(Message):
    """Waits for the key; replied with its value in the blob."""

    key: str
    timeout: float | None = optional()
    id: int | None = optional()


@message("kv_add")
class KvAdd(Message):
    """Replied ``value``: the counter's new value."""

    key: str
    amount: int = 1
    timeout: float | None = optional()
    id: int | None = optional()


@message("kv_wait")
class KvWait(Message):
    keys: list[str]
    timeout: float | None = optional()
    id: int | None = optional()


@message("kv_check")
class KvCheck(Message):
    """Replied ``ok``: every key is set."""

    keys: list[str]
    timeout: float | None = optional()
    id: int | None = optional()


@message("kv_delete")
class KvDelete(Message):
    """Replied ``ok``: the key existed."""

    key: str
    timeout: float | None = optional()
    id: int | None = optional()


@message("kv_num_keys")
class KvNumKeys(Message):
    """Replied ``value``: how many keys are set."""

    timeout: float | None = optional()
    id: int | None = optional()


@message("kv_compare_set")
class KvCompareSet(Message):
    """``expected`` is latin-1 text of the expected bytes; replied with the value the
    key holds afterwards in the blob."""

    key: str
    expected: str
    timeout: float | None = optional()
    id: int | None = optional()
    desired: bytes = blob_field()


KV_REQUESTS: tuple[type[Message], ...] = (KvSet, KvGet, KvAdd, KvWait, KvCheck, KvDelete,
                                          KvNumKeys, KvCompareSet)


@message("stalled")
class Stalled(Message):
    """This rank's call ``seq`` of ``group`` has waited a while: what it called
    (``sig``, compared between ranks; ``call`` and ``where`` for the message)."""

    group: int
    seq: int
    sig: list
    call: str
    where: str
    ranks: list[int]


@message("abort")
class Abort(Message):
    """A call failed on one rank. To the rendezvous it names the group's ``ranks``; the
    rendezvous forwards it without them, with ``by`` (the rank it came from, -1 when the
    rendezvous found the failure itself). ``lost`` and ``left`` go with kind LOST,
    ``missing`` with kind TIMEOUT."""

    ranks: list[int] | None = optional()
    group: int
    seq: int
    reason: str
    kind: AbortKind = _parsed(AbortKind.MISMATCH, AbortKind.parse)
    lost: list[int] | None = optional()
    left: bool | None = optional()
    missing: list[int] | None = optional()
    by: int | None = optional()

    @classmethod
    def of_error(cls, exc: BaseException, group: int, seq: int,
                 ranks: list[int]) -> Abort:
        """The abort that tells ``ranks`` that call ``seq`` of ``group`` failed here."""
        kind = AbortKind.of(exc)
        extra: dict[str, Any] = {}
        if isinstance(exc, PeerLostError):
            extra = {"lost": list(exc.ranks), "left": exc.left}
        elif isinstance(exc, DistTimeoutError):
            extra = {"missing": list(exc.missing)}
        return cls(ranks=list(ranks), group=group, seq=seq, reason=str(exc), kind=kind,
                   **extra)

    def error(self) -> DistError:
        """The error this abort raises on a rank that hears of it."""
        cls = self.kind.error_class
        if cls is PeerLostError:
            return PeerLostError(self.reason, ranks=self.lost or (), left=bool(self.left))
        if cls is DistTimeoutError:
            reason = self.reason if self.by is None else \
                f"{self.reason} (reported by rank {self.by})"
            return DistTimeoutError(reason, missing=self.missing or ())
        return cls(self.reason)


@message("progress")
class Progress(Message):
    """How many calls each of ``ranks`` has entered on ``group``; replied ``entered``
    (rank as text -> count, None if unknown) and ``lost``."""

    group: int
    ranks: list[int]
    id: int | None = optional()


@message("query_reply")
class QueryReply(Message):
    qid: int
    entered: int | None = None


@message("agree")
class Agree(Message):
    """A member asks for a shrink or an agreement (see
    :mod:`minidist.rendezvous.agreement`); ``runs``: the members as [first, last + 1)
    runs; ``incarnations``: the members' that are not 0 (rank as text)."""

    kind: str | None = None
    group: int | None = None
    seq: int | None = None
    runs: list | None = None
    exclude: list[int] | None = None
    flag: bool = True
    incarnations: dict[str, int] | None = optional()
    id: int | None = optional()


# ---------------------------------------------------------------- rendezvous -> rank

@message("welcome")
class Welcome(Message):
    """Every rank joined: each rank's node index, how each node is reached (its agent's
    [host, port], host None for the rendezvous' own node) and what each rank's memory
    takes to read. A restarted rank's welcome also has every rank's incarnation and
    the ranks gone so far (``lost``: rank as text -> why)."""

    world_size: int
    nodes: list[int]
    agents: list | None = None
    reads: list | None = None
    incarnations: list[int] | None = optional()
    lost: dict[str, str] | None = optional()
    left: list[int] | None = optional()


@message("error")
class Error(Message):
    """The registration was refused; ``retry``: a newer rendezvous will follow;
    ``lost``: the ranks that died before every rank joined."""

    retry: bool | None = optional()
    msg: str = "refused"
    lost: list[int] | None = optional()

    def exception(self) -> DistError:
        """The error ``register`` raises."""
        err: DistError = PeerLostError(self.msg, ranks=self.lost) if self.lost else \
            RendezvousError(self.msg)
        err.retry = bool(self.retry)  # type: ignore[attr-defined]
        return err


@message("reply")
class Reply(Message):
    """The answer to request ``id``: the fields its request promises, or ``error``
    (with ``timeout`` when a wait passed its deadline)."""

    id: int | None = None
    timeout: bool | None = optional()
    error: str | None = optional()
    value: Any = optional()
    ok: bool | None = optional()
    entered: dict[str, int | None] | None = optional()
    lost: list[int] | None = optional()
    excluded: list[int] | None = optional()
    gone: list[int] | None = optional()
    epoch: int | None = optional()
    data: bytes = blob_field()

    def exception(self) -> DistError | None:
        """The error a request answered so raises, or None."""
        if self.timeout:
            return DistTimeoutError(str(self.error))
        if self.error is not None:
            return RendezvousError(self.error)
        return None


@message("lost")
class Lost(Message):
    """``rank`` died (-1 is never sent: a rank learns so from its own connection)."""

    rank: int
    reason: str = ""


@message("left")
class Left(Message):
    """``ranks`` left normally (gathered over a short while)."""

    ranks: list[int]


@message("back")
class Back(Message):
    """``rank``, which had died, is back as a new process."""

    rank: int
    incarnation: int


@message("query")
class Query(Message):
    """How many calls has this rank entered on ``group``? Answered by QueryReply."""

    qid: int
    group: int


# ------------------------------------------------------------- agent <-> rendezvous

@message("agent_hello")
class AgentHello(Message):
    """A node agent's first message: its node and where ranks of other nodes reach it
    (host None: the address its connection comes from)."""

    node: str
    host: str | None = None
    port: int


@message("hb")
class Heartbeat(Message):
    """Sent every second each way between a node agent and the rendezvous."""


@message("gone")
class Gone(Message):
    """The agent's connection ``via`` (one of its node's ranks) closed."""

    via: int
