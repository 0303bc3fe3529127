"""Pictures of a collective call: ranks down, rounds across, an arrow per message.

:func:`layout` places every rank's steps in columns (a step sits right of the rank's
previous step and no left of the steps whose messages it receives, so messages go
down or right) and returns a :class:`Picture`: plain shapes that :func:`to_svg` writes
as SVG text (no dependency) and ``minidist algo show`` also renders with matplotlib
(.png). :func:`to_text` writes the same call as a table.

Each arrow is labelled with the elements it carries (``out[0:4]``) and coloured by
*phase*: messages whose data the receiver reduces on arrival, messages it stores or
forwards, and empty messages (synchronization); phases of a composed schedule
(:func:`~minidist.algorithms.compose`) get colours of their own. A ``+`` marks a step
that reduces, ``=`` one that only copies.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

from .compose import PHASE_TAGS
from .schedule import Copy, Recv, Reduce, Schedule, Send

__all__ = ["Arrow", "Picture", "arrow_path", "columns", "curve", "layout", "messages",
           "to_svg", "to_text"]

# colour-blind-friendly pairs (reduced on arrival, stored), one pair per phase
_PALETTE = [("#d62728", "#1f77b4"), ("#ff7f0e", "#2ca02c"), ("#9467bd", "#17becf"),
            ("#8c564b", "#bcbd22"), ("#e377c2", "#7f7f7f")]
_SYNC = "#999999"


@dataclass(frozen=True)
class Msg:
    """One message of the call: who sends what to whom, in which steps."""

    src: int
    src_step: int
    dst: int
    dst_step: int
    tag: int
    send: Send
    recv: Recv
    reduced: bool  # the receiver reduces the data in the step that receives it

    @property
    def label(self) -> str:
        return f"{self.send.buf}[{self.send.lo}:{self.send.hi}]"

    @property
    def phase(self) -> int:
        return self.tag // PHASE_TAGS

    @property
    def category(self) -> str:
        if self.send.hi == self.send.lo:
            return "sync"
        return "reduced" if self.reduced else "stored"


def messages(schedules: Sequence[Schedule]) -> list[Msg]:
    """Every message of the call, matched Send to Recv. ValueError for one that is
    never received (run the simulator for the details)."""
    recvs: dict[tuple[int, int, int], tuple[int, Recv, bool]] = {}
    for r, s in enumerate(schedules):
        for i, st in enumerate(s.steps):
            reduced_regions = [(op.a, op.a_lo, op.n) for op in st.compute
                               if isinstance(op, Reduce)]
            reduced_regions += [(op.b, op.b_lo, op.n) for op in st.compute
                                if isinstance(op, Reduce)]
            for c in st.comms:
                if isinstance(c, Recv):
                    red = any(buf == c.buf and lo < c.hi and c.lo < lo + n
                              for buf, lo, n in reduced_regions)
                    recvs[(c.peer, r, c.tag)] = (i, c, red)
    out = []
    for r, s in enumerate(schedules):
        for i, st in enumerate(s.steps):
            for c in st.comms:
                if isinstance(c, Send):
                    got = recvs.get((r, c.peer, c.tag))
                    if got is None:
                        raise ValueError(f"rank {r} step {i}: {c} is never received")
                    out.append(Msg(r, i, c.peer, got[0], c.tag, c, got[1], got[2]))
    return out


def columns(schedules: Sequence[Schedule], msgs: Sequence[Msg] | None = None
            ) -> list[list[int]]:
    """``col[r][s]``: the column of rank ``r``'s step ``s``: one right of its previous
    step, and no left of the step that sends it a message."""
    msgs = messages(schedules) if msgs is None else msgs
    into: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for m in msgs:
        into.setdefault((m.dst, m.dst_step), []).append((m.src, m.src_step))
    col = [[0] * len(s.steps) for s in schedules]
    for _ in range(sum(len(c) for c in col) + 1):
        changed = False
        for r, s in enumerate(schedules):
            for i in range(len(s.steps)):
                want = col[r][i - 1] + 1 if i else 0
                for src, si in into.get((r, i), ()):
                    want = max(want, col[src][si])
                if want != col[r][i]:
                    col[r][i] = want
                    changed = True
        if not changed:
            break
    return col


@dataclass(frozen=True)
class Arrow:
    x1: float
    y1: float
    x2: float
    y2: float
    color: str
    bend: float  # sideways bulge of the curve, in pixels (0: straight)
    label: str
    dashed: bool = False


@dataclass
class Picture:
    """Shapes in pixel coordinates (y down): what :func:`to_svg` and matplotlib draw."""

    width: float
    height: float
    title: str
    lines: list[tuple[float, float, float, float, str]] = field(default_factory=list)
    arrows: list[Arrow] = field(default_factory=list)
    dots: list[tuple[float, float, str, str]] = field(default_factory=list)  # x, y, fill, mark
    texts: list[tuple[float, float, str, float, str, str]] = field(
        default_factory=list)  # x, y, text, size, anchor, colour
    legend: list[tuple[str, str]] = field(default_factory=list)  # colour, meaning


def layout(schedules: Sequence[Schedule], title: str | None = None) -> Picture:
    """Place the call's steps and messages (see the module docstring)."""
    n = len(schedules)
    msgs = messages(schedules)
    col = columns(schedules, msgs)
    ncols = 1 + max((max(c) for c in col if c), default=0)
    longest = max((len(m.label) for m in msgs), default=4)
    font = 11.0 if n <= 16 else 9.0
    cw = max(70.0, longest * font * 0.62 + 24)
    rh = 56.0 if n <= 16 else 34.0
    left, top = 96.0, 64.0
    width = left + ncols * cw + 30
    height = top + n * rh + 60

    def x(c: int) -> float:
        return left + (c + 0.5) * cw

    def y(r: int) -> float:
        return top + (r + 0.5) * rh

    s0 = schedules[0]
    pic = Picture(width, height, title or f"{s0.collective} / {s0.algorithm}: {n} ranks, "
                  f"count {s0.count}" + (f", root {s0.root}" if s0.root else ""))
    pic.texts.append((12, 24, pic.title, 15, "start", "#000000"))
    for c in range(ncols):
        pic.texts.append((x(c), top - 10, str(c + 1), font, "middle", "#666666"))
    pic.texts.append((left - 10, top - 10, "round", font, "end", "#666666"))
    for r in range(n):
        pic.lines.append((left, y(r), left + ncols * cw, y(r), "#e3e3e3"))
        pic.texts.append((left - 10, y(r) + 4, f"rank {r}", font, "end", "#000000"))
    colours: dict[tuple[int, str], str] = {}
    for m in msgs:
        key = (m.phase, m.category)
        if key not in colours:
            pair = _PALETTE[m.phase % len(_PALETTE)]
            colours[key] = _SYNC if m.category == "sync" else \
                pair[0] if m.category == "reduced" else pair[1]
    for (phase, cat), colour in sorted(colours.items()):
        what = {"reduced": "reduced on arrival", "stored": "stored or forwarded",
                "sync": "empty (synchronization)"}[cat]
        pic.legend.append((colour, (f"phase {phase}: " if len(
            {p for p, _ in colours}) > 1 else "") + what))
    for m in msgs:
        x1, y1, x2, y2 = x(col[m.src][m.src_step]), y(m.src), x(col[m.dst][m.dst_step]), y(m.dst)
        same = abs(x2 - x1) < 1
        # same column: bend so that the two directions of an exchange do not overlap
        span = abs(m.dst - m.src)
        bend = (min(0.45, 0.18 * (1 + 0.35 * (span - 1))) * cw * (1 if y2 > y1 else -1)
                if same else 0.0)
        pic.arrows.append(Arrow(x1, y1, x2, y2, colours[(m.phase, m.category)], bend,
                                "" if m.category == "sync" else m.label,
                                dashed=m.category == "sync"))
    for r, s in enumerate(schedules):
        for i, st in enumerate(s.steps):
            reduces = any(isinstance(op, Reduce) and op.n for op in st.compute)
            copies = any(isinstance(op, Copy) and op.n for op in st.compute)
            mark = "+" if reduces else "=" if copies else ""
            pic.dots.append((x(col[r][i]), y(r), "#333333" if st.comms else "#ffffff", mark))
    ly = top + n * rh + 22
    lx = left
    for colour, meaning in pic.legend:
        pic.lines.append((lx, ly, lx + 26, ly, colour))
        pic.texts.append((lx + 32, ly + 4, meaning, font, "start", "#000000"))
        lx += 44 + len(meaning) * font * 0.6
    pic.texts.append((lx, ly + 4, "+ reduces   = copies", font, "start", "#000000"))
    pic.width = max(pic.width, lx + 20 * font * 0.6 + 20)
    return pic


def curve(a: Arrow) -> tuple[float, float, float, float]:
    """The control point of an arrow's quadratic curve, and its label's position."""
    mx, my = (a.x1 + a.x2) / 2, (a.y1 + a.y2) / 2
    cx, cy = mx + a.bend, my
    # the curve's midpoint is halfway between the chord's midpoint and the control point
    return cx, cy, (mx + cx) / 2, (my + cy) / 2


def arrow_path(a: Arrow, stop: float = 5.0, head: float = 8.0
               ) -> tuple[tuple[float, float], tuple[float, float],
                          list[tuple[float, float]]]:
    """(control point, end of the curve, arrowhead triangle) of an arrow that stops
    ``stop`` pixels short of its target, with a head ``head`` pixels long."""
    cx, cy, _, _ = curve(a)
    dx, dy = a.x2 - cx, a.y2 - cy
    length = max(1e-9, (dx * dx + dy * dy) ** 0.5)
    ux, uy = dx / length, dy / length
    tip = (a.x2 - ux * stop, a.y2 - uy * stop)
    base = (tip[0] - ux * head, tip[1] - uy * head)
    w = head * 0.45
    tri = [tip, (base[0] - uy * w, base[1] + ux * w), (base[0] + uy * w, base[1] - ux * w)]
    return (cx, cy), base, tri


def to_svg(pic: Picture) -> str:
    """The picture as a standalone SVG document."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{pic.width:.0f}" '
           f'height="{pic.height:.0f}" viewBox="0 0 {pic.width:.0f} {pic.height:.0f}" '
           'font-family="Helvetica, Arial, sans-serif">',
           f"<title>{html.escape(pic.title)}</title>",
           '<rect width="100%" height="100%" fill="#ffffff"/>']
    for x1, y1, x2, y2, colour in pic.lines:
        width = 3 if colour != "#e3e3e3" else 1
        out.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                   f'stroke="{colour}" stroke-width="{width}"/>')
    labels = []
    for a in pic.arrows:
        _, _, lx, ly = curve(a)
        (cx, cy), (ex, ey), tri = arrow_path(a)
        dash = ' stroke-dasharray="4 3"' if a.dashed else ""
        out.append(f'<path d="M{a.x1:.1f},{a.y1:.1f} Q{cx:.1f},{cy:.1f} {ex:.1f},{ey:.1f}" '
                   f'fill="none" stroke="{a.color}" stroke-width="1.6"{dash}/>')
        points = " ".join(f"{px:.1f},{py:.1f}" for px, py in tri)
        out.append(f'<polygon points="{points}" fill="{a.color}"/>')
        if a.label:
            w = len(a.label) * 5.4 + 4
            left = a.bend < 0  # a curve bent left is labelled on its left
            x0 = lx - 3 - w if left else lx + 1
            labels.append(f'<rect x="{x0:.1f}" y="{ly - 9:.1f}" width="{w:.1f}" '
                          'height="12" fill="#ffffff" fill-opacity="0.85"/>')
            labels.append(f'<text x="{x0 + 2:.1f}" y="{ly:.1f}" font-size="9" '
                          f'fill="{a.color}">{html.escape(a.label)}</text>')
    out += labels
    for x, y, fill, mark in pic.dots:
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{fill}" stroke="#333333"/>')
        if mark:
            out.append(f'<text x="{x - 12:.1f}" y="{y - 6:.1f}" font-size="12" '
                       f'font-weight="bold" fill="#333333">{mark}</text>')
    for x, y, text, size, anchor, colour in pic.texts:
        out.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size:g}" '
                   f'text-anchor="{anchor}" fill="{colour}">{html.escape(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def to_text(schedules: Sequence[Schedule]) -> str:
    """The call as text: a grid of ranks by rounds (``>3`` sends to rank 3, ``<1``
    receives from rank 1, ``+`` reduces, ``=`` copies), then every message."""
    n = len(schedules)
    msgs = messages(schedules)
    col = columns(schedules, msgs)
    ncols = 1 + max((max(c) for c in col if c), default=0)
    cells = [[""] * ncols for _ in range(n)]
    for r, s in enumerate(schedules):
        for i, st in enumerate(s.steps):
            parts = [(">" if isinstance(c, Send) else "<") + str(c.peer) for c in st.comms]
            if any(isinstance(op, Reduce) and op.n for op in st.compute):
                parts.append("+")
            elif any(op.n for op in st.compute):
                parts.append("=")
            cells[r][col[r][i]] = " ".join(parts)
    width = max([len(c) for row in cells for c in row] + [3])
    s0 = schedules[0]
    lines = [f"{s0.collective} / {s0.algorithm}: {n} ranks, count {s0.count}"
             + (f", root {s0.root}" if s0.root else ""),
             "rounds across; >k sends to rank k, <k receives from rank k, + reduces, = copies",
             "",
             "rank | " + " | ".join(f"{c + 1:<{width}}" for c in range(ncols))]
    lines.append("-" * len(lines[-1]))
    for r in range(n):
        lines.append(f"{r:4d} | " + " | ".join(f"{c:<{width}}" for c in cells[r]))
    lines += ["", "messages (round: from -> to  elements sent -> where received, what is "
              "done with them):"]
    for m in sorted(msgs, key=lambda m: (col[m.src][m.src_step], m.src, m.dst)):
        what = {"reduced": "reduced", "stored": "stored", "sync": "empty"}[m.category]
        lines.append(f"  {col[m.src][m.src_step] + 1:3d}: {m.src:3d} -> {m.dst:<3d} "
                     f"{m.label} -> {m.recv.buf}[{m.recv.lo}:{m.recv.hi}]  {what}")
    return "\n".join(lines) + "\n"
