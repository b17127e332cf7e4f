"""Timelines of a concurrent history: one lane per caller, a bar per call, the culprits marked.

After Porcupine's visualization and Jepsen's timeline.html.  The horizontal axis is the *order*
of the invoke and return events, not their times: two bars overlap exactly when the two calls
did, and a call of a few microseconds is as readable as one of a second.  Under the bars, a thin
line shows how long each lease was held (from its claim's answer to the call that gave it up,
or to the drain); the leases of the calls the checker blames are drawn in red.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from .history import Record

__all__ = ["describe_call", "timeline_svg", "timeline_text"]

LANE = 46
SLOT = 22
CHAR = 6  # pixels per character of the 10-pixel monospace labels
LEFT = 64
TOP = 34


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else getattr(value, name, None)


def _lease(value: Any) -> str:
    return f"{_field(value, 'group_id')}:{_field(value, 'event')}"


def _token(value: Any) -> str:
    token = str(_field(value, "token"))
    return token if len(token) <= 10 else "…" + token[-6:]


def describe_call(record: Record, *, short: bool = False) -> str:
    """``claim → g1:e1 (…3fa2c1)``, ``ack(g1:e1 …3fa2c1) → True``, ``publish(g1, e2)``; with
    ``short`` (a bar's label) ``claim→g1:e1``, ``ack g1:e1→True``, ``pub g1 e2``."""
    args, answer = record.args, record.result
    if record.op == "publish":
        call = f"pub {args.get('group_id')} {args.get('event')}" if short else \
            f"publish({args.get('group_id')}, {args.get('event')})"
    elif record.op == "claim":
        call = "claim"
    else:
        lease, delay = args.get("lease"), args.get("delay", 0)
        extra = f", {delay:g}" if record.op == "nack" and delay else ""
        call = f"{record.op} {_lease(lease)}" if short else f"{record.op}({_lease(lease)} {_token(lease)}{extra})"
    if record.error is not None:
        return f"{call} raised" if short else f"{call} raised {record.error}"
    if record.complete is None:
        return call if short else f"{call} (no answer)"
    if record.op == "publish" and answer is None:
        return call
    if record.op == "claim":
        answer = "None" if answer is None else _lease(answer) + ("" if short else f" ({_token(answer)})")
        return f"{call}→{answer}" if short else f"{call} → {answer}"
    return f"{call}→{answer}" if short else f"{call} → {answer!r}"


def _lanes(records: Sequence[Record]) -> list[str]:
    return list(dict.fromkeys(record.worker for record in records))


def _slots(records: Sequence[Record]) -> dict[float, int]:
    """Each distinct event time -> its rank (the horizontal position)."""
    times = sorted({r.invoke for r in records} | {r.complete for r in records if r.complete is not None})
    return {t: rank for rank, t in enumerate(times)}


def timeline_text(records: Sequence[Record], culprits: Sequence[Record] = ()) -> str:
    """The history as lines, in order of invocation: lane, event ranks, call; ``<<`` marks a
    culprit."""
    slots = _slots(records)
    blamed = {id(record) for record in culprits}
    width = max((len(worker) for worker in _lanes(records)), default=4)
    lines = []
    for record in sorted(records, key=lambda r: r.invoke):
        end = "…" if record.complete is None else slots[record.complete]
        mark = "  <<" if id(record) in blamed else ""
        lines.append(f"{record.worker:<{width}}  [{slots[record.invoke]:>3} .. {end:>3}]  {describe_call(record)}{mark}")
    return "\n".join(lines)


def timeline_svg(records: Sequence[Record], culprits: Sequence[Record] = (), *, title: str = "") -> str:
    """The history as an SVG picture (see the module docstring)."""
    slots = _slots(records)
    lanes = {worker: n for n, worker in enumerate(_lanes(records))}
    blamed = {id(record) for record in culprits}
    end_slot = len(slots)
    slot = SLOT  # wide enough for every bar's label to fit in its bar
    for record in records:
        span = (slots[record.complete] if record.complete is not None else end_slot) - slots[record.invoke]
        slot = max(slot, min(90, (len(describe_call(record, short=True)) * CHAR + 8) // max(span, 1)))
    width = LEFT + (end_slot + 1) * slot + 40
    height = TOP + len(lanes) * LANE + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="10">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="8" y="16" font-size="12" font-weight="bold">{escape(title[:160])}</text>',
    ]
    for worker, lane in lanes.items():
        y = TOP + lane * LANE
        out.append(f'<line x1="{LEFT}" y1="{y + LANE - 4}" x2="{width - 8}" y2="{y + LANE - 4}" stroke="#eee"/>')
        out.append(f'<text x="8" y="{y + 18}" font-weight="bold">{escape(worker)}</text>')
    for record in records:
        y = TOP + lanes[record.worker] * LANE
        x0 = LEFT + slots[record.invoke] * slot
        x1 = LEFT + (slots[record.complete] if record.complete is not None else end_slot) * slot
        bad = id(record) in blamed
        fill = "#f8d0d0" if bad else ("#fde9c8" if record.error else "#dbe8f6")
        stroke = "#c00" if bad else "#678"
        out.append(
            f'<rect x="{x0}" y="{y + 4}" width="{max(x1 - x0, 6)}" height="20" rx="3" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{2 if bad else 1}"><title>{escape(describe_call(record))}</title></rect>'
        )
        out.append(f'<text x="{x0 + 4}" y="{y + 17}">{escape(describe_call(record, short=True))}</text>')
    for claim, start, end in _holds(records, slots, end_slot):
        y = TOP + lanes[claim.worker] * LANE + 30
        colour = "#c00" if id(claim) in blamed else "#89a"
        x0, x1 = LEFT + start * slot, LEFT + end * slot
        out.append(f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="{colour}" stroke-width="3"/>')
        out.append(f'<text x="{x0}" y="{y + 11}" fill="{colour}" font-size="9">lease {escape(_lease(claim.result))}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _holds(records: Sequence[Record], slots: dict[float, int], end_slot: int) -> list[tuple[Record, int, int]]:
    """(claim, from, to) per lease: from the claim's answer to the first call that gave it up
    with success, else to the end."""
    spans = []
    for claim in records:
        if claim.op != "claim" or claim.complete is None or claim.error or claim.result is None:
            continue
        token = _field(claim.result, "token")
        ends = [slots[r.invoke] for r in records if r.op in ("ack", "nack") and r.result is True
                and _field(r.args.get("lease"), "token") == token and r.invoke >= claim.complete]
        spans.append((claim, slots[claim.complete], min(ends, default=end_slot)))
    return spans
