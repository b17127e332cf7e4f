"""Runs of like calls in a regression test, folded into loops (SPEC.md C14).

A probe's failure (SPEC.md C13a) is a program of a thousand calls and more: 1,100 publishes,
then 1,100 claims each nacked.  Written a call at a time, its test ran to 4,000 lines, more than
anyone pastes into a suite.  So the test's statements are read as blocks, one per call (or a
clock set), and where a few blocks repeat with only their literals changing, the run is
written once inside ``for n in range(count):``, each literal that changes as an expression of
``n``:

- the same in every repetition: itself;
- whole numbers (or floats, exactly) that go up by the same step: ``1000.5 + 0.5 * n``;
- text holding such a number among what does not change: ``f'g1+{n}'``;
- a lease, named by the claim that took it (``lease[7]``): ``lease[n + 7]``;
- values that come round again after a few: ``('w1', 'w2', 'W')[n % 3]``.

A run with any other literal is left as it is.  The loop makes the same calls, with the same
arguments, in the same order, and asserts the same answers.
"""

from __future__ import annotations

import ast
import re

__all__ = ["folded"]

LEAST = 10
"""Repetitions below which a run is left written out: a few calls read better one by one."""

LONGEST_PERIOD = 4
"""Blocks in the longest repeating unit looked for (a claim, its assertion and its nack are two)."""

LONGEST_CYCLE = 16
"""Values in the longest cycle a literal may come round in (the example's worker ids)."""

_LITERAL = re.compile(
    r"""(?P<lease>\blease\[\d+\])"""
    r"""|(?P<text>(?<!\w)[bB]?(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))"""
    r"""|(?P<number>(?<![\w.])\d+(?:\.\d+)?(?:e[+-]?\d+)?(?![\w.]))"""
)


def folded(blocks: list[list[str]]) -> list[str]:
    """The lines of ``blocks``, each run of at least :data:`LEAST` repetitions of a unit of
    up to :data:`LONGEST_PERIOD` blocks that differ only in foldable literals written as a loop."""
    shapes = [_shape("\n".join(block))[0] for block in blocks]
    out: list[str] = []
    start = 0
    while start < len(blocks):
        period, count = _longest_run(shapes, start)
        units = [[line for block in blocks[start + r * period: start + (r + 1) * period] for line in block]
                 for r in range(count)]
        looped, lines = _loop(units) if count >= LEAST else (0, [])
        if looped:
            out += lines
            start += period * looped
        else:
            out += blocks[start]
            start += 1
    return out


def _longest_run(shapes: list[str], start: int) -> tuple[int, int]:
    """The period (in blocks) and repetitions of the run of like units that covers the most
    blocks from ``start``."""
    best = (1, 1)
    for period in range(1, LONGEST_PERIOD + 1):
        unit = shapes[start:start + period]
        if len(unit) < period:
            break
        count = 1
        while shapes[start + count * period: start + (count + 1) * period] == unit:
            count += 1
        if count * period > best[0] * best[1]:
            best = (period, count)
    return best


def _shape(text: str) -> tuple[str, list[str]]:
    """``text`` with each literal (a text, a number, a lease) as a slot, and the literals."""
    values: list[str] = []

    def slot(match: re.Match) -> str:  # a slot says its kind: a column holds one kind of literal
        values.append(match.group(0))
        return f"\0{match.lastgroup}\0"

    return _LITERAL.sub(slot, text), values


def _loop(units: list[list[str]]) -> tuple[int, list[str]]:
    """The longest run of ``units`` from the first that one loop over ``n`` writes, as how many
    units it makes and its lines; (0, []) if it would make fewer than :data:`LEAST`."""
    template, _ = _shape("\n".join(units[0]))
    columns = list(zip(*(_shape("\n".join(unit))[1] for unit in units)))
    described = [_described(list(column)) for column in columns]
    count = min((length for _, length in described), default=len(units))
    if count < LEAST:
        return 0, []
    pieces = iter(expression for expression, _ in described)
    body = re.sub("\0\\w+\0", lambda match: next(pieces), template)
    return count, [f"for n in range({count}):", *(f"    {line}" for line in body.splitlines())]


def _described(values: list[str]) -> tuple[str, int]:
    """An expression of ``n`` that is ``values[n]`` for the longest run of ``n`` from 0 it can
    be, and that run's length (at least 1: the first value itself)."""
    found = [(values[0], _fitted(values, lambda n: values[0]))]
    if values[0].startswith("lease["):
        numbers = [int(value[6:-1]) for value in values]
        first, step = numbers[0], (numbers[1] - numbers[0] if len(numbers) > 1 else 0)
        found.append((f"lease[{_linear(first, step)}]", _fitted(numbers, lambda n: first + step * n)))
        return max(found, key=lambda candidate: candidate[1])
    literals = [ast.literal_eval(value) for value in values]
    if type(literals[0]) in (int, float) and len(literals) > 1:
        first, step = literals[0], literals[1] - literals[0]
        linear = _linear(first, step)
        found.append((f"({linear})" if " " in linear else linear,  # a sign before it applies to all of it
                       _fitted(literals, lambda n: first + step * n)))
    if isinstance(literals[0], str):
        found.append(_numbered(literals))
    for period in range(2, min(LONGEST_CYCLE, len(values) // 2) + 1):
        length = _fitted(values, lambda n, period=period: values[n % period])
        if length >= 2 * period:  # come round at least once: any values fit one period
            found.append((f"({', '.join(values[:period])})[n % {period}]", length))
    return max(found, key=lambda candidate: candidate[1])


def _fitted(values: list, expected) -> int:
    """How many of ``values``, from the first, are ``expected(n)``, written alike (a float is no
    int, and -0.0 no 0.0)."""
    for n, value in enumerate(values):
        if repr(value) != repr(expected(n)):
            return n
    return len(values)


def _linear(first, step) -> str:
    """``first + step * n``, as briefly as it reads (of whole numbers: a float keeps both)."""
    if isinstance(first, float) or isinstance(step, float):
        return f"{first!r} + {step!r} * n"
    times = "n" if step == 1 else f"{step!r} * n"
    return times if first == 0 else f"{first!r} + {times}"


def _numbered(texts: list[str]) -> tuple[str, int]:
    """An f-string of ``n`` for the texts that differ from the first in one number only
    (``'g1+0'``, ``'g1+1'``...), the number going up by one step, and how many from the first
    it writes."""
    best = (repr(texts[0]), 1)
    first = texts[0]
    for found in re.finditer(r"\d+", first):
        prefix, digits, suffix = first[:found.start()], found.group(), first[found.end():]
        if str(int(digits)) != digits or len(texts) < 2:
            continue
        second = re.fullmatch(re.escape(prefix) + r"(\d+)" + re.escape(suffix), texts[1])
        if second is None:
            continue
        start, step = int(digits), int(second.group(1)) - int(digits)
        length = _fitted(texts, lambda n: f"{prefix}{start + step * n}{suffix}")
        if length > best[1]:
            expression = _linear(start, step)
            if not prefix and not suffix:
                best = (f"str({expression})", length)
            else:
                literal = (prefix.replace("{", "{{").replace("}", "}}") + "{" + expression + "}"
                           + suffix.replace("{", "{{").replace("}", "}}"))
                best = ("f" + repr(literal), length)
    return best
