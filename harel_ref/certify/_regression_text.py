"""The recorded calls of a failure written out as a pytest module (:mod:`._regression`).

The module it writes defines the user's ``factory`` (the line a reproduction starts with), a
hand-set ``Clock`` that moves as a real clock does within one call (SPEC.md R3a: each reading
after a call's first one :data:`~harel_ref.stateful._values.TICK` later), a wrapper that tells
the clock where each call begins, and one ``def test_...():`` that makes the calls in order and
asserts at each what the specification allows, the model's reason in the failing assertion's
message.  It imports the standard library, pytest where a call must raise, and of harel-ref
only the Protocol's ``Lease``, where a lease is made by hand before the transport handed one
out.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import harel_ref.stateful._facts as facts
from harel_ref.stateful._values import TICK

from ._regression_loops import folded

__all__ = ["Call", "OneShot", "Unwritable", "docstring_text", "written"]


@dataclass
class OneShot:
    """An iterator given as an argument (routing keys as ``iter([...])``): its items."""

    items: list[Any]


@dataclass
class Call:
    """One call the machine made of transport number ``instance``: ``open``, or one of the
    Protocol's methods, with its arguments, the clock it was made at, its answer or error, and
    what it may answer (``allowed``: a claim's outcomes; ``refuses``: the error bad input must
    raise; ``after_close``: it must raise, saying the transport is closed).  ``diverged``: the
    fact of the call where the transport left the specification, the last one recorded."""

    instance: int
    method: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    now: Any = None
    answer: Any = None
    raised: BaseException | None = None
    allowed: frozenset | None = None
    refuses: type[Exception] | None = None
    after_close: bool = False
    diverged: Any = None


class Unwritable(Exception):
    """The calls hold something a plain test cannot write down (said in the message)."""


DOCSTRING = '''"""Regression test: {summary}

Found by harel-ref's {prop} search{replay}.  It makes the calls of the failing example with
a clock set by hand and asserts what the specification allows at each: it fails while the bug
is there, and passes once it is fixed.  Run it with pytest from the directory you certified in.
"""
'''

CLOCK = '''

class Clock:
    """The transport's clock, set by hand.  Within one call it moves on as a real clock does:
    every reading after the call's first is {tick!r} s later than the one before."""

    def __init__(self, now):
        self.now, self.reads = now, 0

    def __call__(self):
        reading = self.now
        if self.reads and type(reading) in (int, float):
            reading += self.reads * {tick!r}
        self.reads += 1
        return reading


class Clocked:
    """A transport whose every call begins the clock's readings anew."""

    def __init__(self, transport, clock):
        self.transport, self.clock = transport, clock

    def __getattr__(self, name):
        method = getattr(self.transport, name)

        def call(*args, **kwargs):
            self.clock.reads = 0
            return method(*args, **kwargs)

        return call
'''

HELPERS = {
    "claimed": '''

def claimed(lease):
    """What a claim answered: None, or its lease's group and event."""
    return None if lease is None else (lease.group_id, lease.event)
''',
    "says_closed": '''

def says_closed(error):
    """Whether an error says the transport is closed, by its type (or one it derives from) or
    its message."""
    said = " ".join([*(kind.__name__ for kind in type(error).__mro__), str(error)]).lower()
    return "closed" in said or "after close" in said
''',
    "forged": '''

def forged(lease, **fields):
    """A lease of the transport's own type with other fields (a Lease is a plain dataclass)."""
    return dataclasses.replace(lease, **fields)
''',
}
"""The helpers a test may use, each written into it only if it does."""

HAREL_HELPERS = {
    "event": '''

def event(text):
    """The harel Event harel-ref published for the event text ``text``: the same one every time."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return Event(id=f"harel-ref-{digest}", kind="harel-ref", data={"text": text})
''',
    "claimed": '''

def claimed(lease):
    """What a claim answered: None, or its lease's group and the text of its event (an Event
    harel-ref did not publish as ``event(text)`` is shown as it is)."""
    if lease is None:
        return None
    data = getattr(lease.event, "data", None)
    text = data.get("text") if isinstance(data, dict) else None
    return (lease.group_id, text if isinstance(text, str) and lease.event == event(text) else repr(lease.event))
''',
}
"""For a transport of harel's Protocol (SPEC.md R20): its events are harel Events, each made from
an event text as the checkers make it (``stateful/_harel.py``'s ``to_event``)."""

LONG = 200
"""Lines past which REPORT.md and the pytest plugin show where the test is, not the test."""


def written(calls: list[Call], *, setup: str, is_async: bool, prop: str, fact: Any, replay: str = "",
            opens: str = "factory(clock, namespace)", harel: bool = False, deadline: float | None = None) -> str:
    """The test module for ``calls`` (the last one the call that diverged, with ``fact``).
    ``opens``: the factory's call, as :func:`~harel_ref.stateful._harel.call_factory` makes it;
    ``harel``: the transport speaks harel's Protocol (the calls were recorded in this package's);
    ``deadline``: the seconds a call that hung was given (made on a thread, or as a task, that
    the test leaves to it after that long)."""
    summary = " ".join(f"{fact.step}: the specification allows {fact.expected}; the transport answered "
                       f"{fact.answered}".split())
    summary = summary if len(summary) <= 300 else summary[:297] + "..."
    writer = _Writer(is_async, _message(fact), harel, deadline)
    body = writer.lines(calls)
    name = f"test_{prop}_{fact.kind}".replace("-", "_")
    return "".join([
        DOCSTRING.format(summary=docstring_text(summary), prop=prop,
                         replay=f" (`{docstring_text(replay)}`)" if replay else ""),
        _imports(writer, is_async, "namespace" in opens),
        _setup(setup),
        CLOCK.format(tick=TICK),
        *(writer.helpers[helper] for helper in writer.helpers if helper in writer.used),
        _test(name, body, is_async, opens, calls[0].now),
    ])


def docstring_text(text: str) -> str:
    """``text`` as it can stand in a docstring and read the same once compiled: a backslash
    doubled, three double quotes as single ones, and a character that is not printable (a NUL,
    a line break) spelled as its escape."""
    text = text.replace("\\", "\\\\").replace('"""', "'''")
    return "".join(char if char.isprintable() else repr(char)[1:-1].replace("\\", "\\\\") for char in text)


def _imports(writer: _Writer, is_async: bool, named: bool) -> str:
    """The import lines the test needs: the standard library's, pytest where a call must raise,
    and the Protocol's Lease where one was made by hand."""
    standard = ["asyncio", "inspect"] * is_async + ["contextlib"] + ["dataclasses"] * ("forged" in writer.used)
    standard += ["hashlib"] * writer.harel + ["threading"] * writer.threads
    lines = [f"import {module}" for module in sorted(standard + ["uuid"] * named)]
    lines += ["", "import pytest"] if writer.raises else []
    if writer.harel:
        lines += ["", "from harel.spec.states import Event"]
        lines += ["from harel.engine.transport import Lease  # for a lease made by hand"] if writer.hand_made else []
    elif writer.hand_made:
        lines += ["", "from harel_ref import Lease  # the Protocol's, for a lease made by hand"]
    return "\n" + "\n".join(lines) + "\n"


def _setup(setup: str) -> str:
    """The lines that define ``factory``; for a factory that cannot be imported by name, a skip
    that says so until the user writes the line."""
    if setup.startswith("factory = ..."):
        setup = ("import pytest  # noqa: E402\n\n"
                 "factory = None  # the factory you certified: it cannot be imported by name, so set it here\n"
                 "if factory is None:\n"
                 "    pytest.skip('set factory to the factory you certified', allow_module_level=True)")
    return f"\n# The transport under test: the factory certified.\n{setup}\n"


def _test(name: str, body: list[str], is_async: bool, opens: str, start: Any) -> str:
    """The test function: it opens the transports on a namespace of its own, makes the calls,
    and closes what it opened (and gives the namespace back) whatever happens."""
    named = "namespace" in opens
    lines = [
        f"    clock = Clock({start!r})",
        *(['    namespace = f"ns_{uuid.uuid4().hex[:12]}"'] if named else []),
        "    queues = []",
        "",
        f"    {'async ' if is_async else ''}def opened():",
        "        clock.reads = 0",
        f"        made = {opens}",
        *(["        if inspect.isawaitable(made):", "            made = await made"] if is_async else []),
        "        queues.append(Clocked(made, clock))",
        "        return queues[-1]",
        "",
        "    try:",
        *("        " + line for line in body),
        "    finally:",
        "        for queue in queues:",
        "            with contextlib.suppress(Exception):",
        f"                {'await ' if is_async else ''}queue.close()",
        *(["        if hasattr(factory, 'discard'):", "            factory.discard(namespace)"] if named else []),
    ]
    if is_async:
        return f"\n\ndef {name}():\n    asyncio.run(_{name}())\n\n\nasync def _{name}():\n" + "\n".join(lines) + "\n"
    return f"\n\ndef {name}():\n" + "\n".join(lines) + "\n"


def _message(fact: Any) -> str:
    """The failing assertion's message: the step, what the specification allows there and why,
    what the transport answered, and the queue as the model held it."""
    text = (f"{fact.step}{fact.note()}: the specification allows {fact.expected}; the transport answered "
            f"{fact.answered}. The queue per harel-ref's model: {fact.state}")
    text = " ".join(text.split())
    return text if len(text) <= 1500 else text[:1497] + "..."


class _Writer:
    """The statements of the test's body, a call at a time, naming each transport ``qN`` and
    each lease a claim answered ``lease[N]``; what it used, for the module's imports and helpers."""

    def __init__(self, is_async: bool, message: str, harel: bool = False, deadline: float | None = None) -> None:
        self.awaited = "await " if is_async else ""
        self.deadline = deadline  # for the call that hung
        self.harel = harel  # harel's Protocol: Events for event texts, no routing keys, acks unjudged
        self.helpers = {**HELPERS, **HAREL_HELPERS} if harel else HELPERS
        self.message = message
        self.names: dict[int, str] = {}  # id() of a lease the transport handed out -> its name
        self.kept: list[Any] = []  # those leases, so that their ids stay theirs
        self.claims = 0
        self.now: Any = None
        self.used: set[str] = set()  # the HELPERS it called
        self.raises = False  # a call must raise: pytest.fail is written
        self.threads = False  # a call that hung is made on a thread
        self.hand_made = False  # a lease made by hand, of the Protocol's Lease type

    def lines(self, calls: list[Call]) -> list[str]:
        """The body's statements: a block per call (and per clock set), runs of like blocks
        folded into loops (:mod:`._regression_loops`)."""
        blocks: list[list[str]] = []
        self.now = calls[0].now  # the clock starts there
        for call in calls:
            if call.after_close and call.diverged is None and call.method != "close":
                continue  # refused as it should be: a closed transport stays as it was
            if call.now is not None and not _same(call.now, self.now):
                blocks.append([f"clock.now = {_literal(call.now, self)}"])
                self.now = call.now
            blocks.append(self.call(call))
        leases = ["lease = {}  # each claim's answer, by the claim's number"] if self.claims else []
        return leases + folded(blocks)

    def call(self, call: Call) -> list[str]:
        queue = f"q{call.instance}"
        if call.method == "open":
            return [f"{queue} = {self.awaited}opened()"]
        diverged = call.diverged is not None
        made = f"{self.awaited}{queue}.{call.method}({self.arguments(call)})"
        if diverged and call.diverged.kind == facts.HUNG:
            return self.hung(call, made)
        if diverged and (call.diverged.kind in facts.FAULTS or (
                call.raised is not None and not call.after_close and call.refuses is None)):
            return self.faulted(call, made)  # it raised where the specification allows an answer
        if call.method == "close":
            return [made]  # closing twice is harmless (R14): only a fault raises here
        if call.after_close or call.refuses is not None:
            return self.refused(call, made, diverged)
        if call.method == "claim":
            return self.claim(call, made, diverged)
        why = f", {self.message!r}" if diverged else ""
        if call.method in ("ack", "nack") and self.harel:
            return [made]  # harel ignores what they answer (R20): what follows is judged
        if call.method in ("ack", "nack") and (call.raised is None or diverged):
            return [f"assert {made} is {_expected_answer(call)!r}{why}"]
        if call.method == "publish" and diverged and call.diverged.kind == facts.PUBLISH_ANSWERED:
            return [f"assert {made} is None{why}"]
        return [made]  # a publish, or a call whose error is the failure itself

    def claim(self, call: Call, made: str, diverged: bool) -> list[str]:
        self.claims += 1
        name = f"lease[{self.claims}]"
        earlier = [self.names[id(lease)] for lease in self.kept]
        out = [f"{name} = {made}"]
        if call.answer is not None and call.raised is None:
            self.names[id(call.answer)] = name
            self.kept.append(call.answer)
        why = f", {self.message!r}" if diverged else ""
        if diverged and call.diverged.kind == facts.TOKEN_REUSED:
            return out + [f"assert {name}.token not in [{', '.join(f'{e}.token' for e in earlier)}]{why}"]
        if call.allowed is not None and call.raised is None:
            allowed = sorted(call.allowed, key=lambda outcome: (outcome is not None, outcome))
            if allowed == [None]:
                shown = f"{name} is None"
            elif len(allowed) == 1:
                shown = f"claimed({name}) == {_literal(allowed[0], self)}"
            else:
                shown = f"claimed({name}) in [{', '.join(_literal(outcome, self) for outcome in allowed)}]"
            self.used.update((["claimed"] + ["event"] * self.harel) if "claimed(" in shown else [])
            out.append(f"assert {shown}{why}")
        return out

    def faulted(self, call: Call, made: str) -> list[str]:
        """The call that raised, panicked or ended its thread where the specification allows an
        answer, which is the failure: it must return (a panic and ``SystemExit`` caught too, to
        say so), and an ack or nack must answer what the specification gives (a stale one that
        stops raising but answers True is still wrong)."""
        self.raises = True
        returns = made
        if call.method in ("ack", "nack") and not self.harel and call.diverged.kind not in facts.FAULTS:
            returns = f"assert {made} is {_expected_answer(call)!r}, {self.message!r}"
        return ["try:", f"    {returns}", "except AssertionError:", "    raise",
                "except BaseException as error:  # what the transport raised is the failure",
                f'    pytest.fail(f"{{type(error).__name__}}: {{error}}. " + {self.message!r})']

    def hung(self, call: Call, made: str) -> list[str]:
        """The call that hung: made on a thread of its own (a task, for an asyncio transport)
        that the test leaves to it after the certifier's call deadline."""
        said = f"{call.method} did not return within {self.deadline!r} s. "
        if self.awaited:
            self.raises = True
            return ["try:", f"    await asyncio.wait_for({made.removeprefix('await ')}, {self.deadline!r})",
                    "except asyncio.TimeoutError:", "    queues.clear()  # left as they are: a close could wait too",
                    f"    pytest.fail({said!r} + {self.message!r})"]
        self.threads = self.raises = True
        return ["returned = []  # what the call answered, if it returns",
                f"call = threading.Thread(target=lambda: returned.append({made}), daemon=True)",
                "call.start()", f"call.join({self.deadline!r})",
                "if not returned:",
                "    queues.clear()  # left as they are: a close could wait for the call too",
                f"    pytest.fail({said!r} + {self.message!r})"]

    def refused(self, call: Call, made: str, diverged: bool) -> list[str]:
        """A call that must raise: bad input (its error) or any call after close (an error that
        says so)."""
        self.raises = True
        error = call.refuses.__name__ if call.refuses is not None else "Exception"
        check = "says_closed(error)" if call.after_close else ""
        self.used.update(["says_closed"] if check else [])
        out = ["try:", f"    {made}", f"except {error}{' as error' if check else ''}:"]
        out.append(f"    assert {check}, {self.message!r}" if check and diverged else
                   f"    assert {check}" if check else "    pass")
        failed = self.message if diverged else "it did not raise"
        return out + ["else:", f"    pytest.fail({failed!r})"]

    def arguments(self, call: Call) -> str:
        args, kwargs = (call.args, call.kwargs) if not self.harel else self.harel_arguments(call)
        shown = [_literal(arg, self) for arg in args]
        shown += [f"{name}={_literal(value, self)}" for name, value in kwargs.items()]
        return ", ".join(shown)

    def harel_arguments(self, call: Call) -> tuple[tuple, dict]:
        """The arguments of ``call`` in harel's Protocol: a published event text as its Event,
        and no routing keys (the adapter refuses any but None, so the call had none)."""
        args = list(call.args)
        kwargs = {name: value for name, value in call.kwargs.items() if name not in ("routing_key", "routing_keys")}
        routing_at = {"publish": 3, "claim": 3}.get(call.method)
        if routing_at is not None and len(args) > routing_at and args[routing_at] is None:
            del args[routing_at:]
        if call.method == "publish" and len(args) > 1 and isinstance(args[1], str):
            args[1] = _EventOf(args[1])
            self.used.add("event")
        return tuple(args), kwargs

    def lease_like(self, value: Any) -> str:
        """A lease the transport never handed out (a forged one): a copy of the last one it did,
        with this one's fields; before it handed any out, the Protocol's own Lease.  (Of harel's
        Protocol: its event an Event, its token harel's, after the checkers' ``|``.)"""
        given = {name: getattr(value, name) for name in ("group_id", "event", "seq", "token")}
        if self.harel:
            given["token"] = given["token"].partition("|")[2] if isinstance(given["token"], str) else given["token"]
            if isinstance(given["event"], str):
                given["event"] = _EventOf(given["event"])
                self.used.add("event")
        fields = ", ".join(f"{name}={_literal(given_value, self)}" for name, given_value in given.items())
        if not self.kept:
            self.hand_made = True
            return f"Lease({fields})"
        self.used.add("forged")
        return f"forged({self.names[id(self.kept[-1])]}, {fields})"


def _expected_answer(call: Call) -> Any:
    """What an ack or nack must answer: what it answered, where the machine judged that right;
    at the call that diverged, the fact's expectation (its first word: True, False or None)."""
    if call.diverged is None:
        return call.answer
    word = call.diverged.expected.split(":")[0].split()[0] if call.diverged.expected else ""
    if word not in ("True", "False", "None"):
        raise Unwritable(f"an ack or nack whose answer the specification gives as {call.diverged.expected!r}")
    return {"True": True, "False": False, "None": None}[word]


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


@dataclass(frozen=True)
class _EventOf:
    """An event text given to a transport of harel's Protocol as its Event: ``event(text)``."""

    text: str


def _literal(value: Any, writer: _Writer) -> str:
    """``value`` as Python source, a lease by its name."""
    if id(value) in writer.names:
        return writer.names[id(value)]
    if isinstance(value, _EventOf):
        return f"event({_text(value.text)})"
    if value is None or isinstance(value, (bool, int, bytes)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, OneShot):
        return f"iter({_literal(value.items, writer)})"
    if isinstance(value, (list, tuple, set, frozenset)):
        return _collection(value, writer)
    if all(hasattr(value, name) for name in ("group_id", "event", "seq", "token")):
        return writer.lease_like(value)
    raise Unwritable(f"an argument of type {type(value).__name__}: {value!r:.80}")


def _collection(value: list | tuple | set | frozenset, writer: _Writer) -> str:
    """A list, tuple, set or frozenset as source (a set's items in a fixed order)."""
    ordered = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
    items = [_literal(item, writer) for item in ordered]
    if isinstance(value, list):
        return f"[{', '.join(items)}]"
    if isinstance(value, tuple):
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    shown = f"{{{', '.join(items)}}}" if items else "set()"
    return f"frozenset({shown})" if isinstance(value, frozenset) else shown


def _text(value: str) -> str:
    """A str as source; a long one with its runs of one character written as ``'x' * n``."""
    if len(value) <= 80:
        return repr(value)
    parts, plain = [], ""
    for char, run in itertools.groupby(value):
        count = len(list(run))
        if count >= 16:
            if plain:
                parts.append(repr(plain))
                plain = ""
            parts.append(f"{char!r} * {count}")
        else:
            plain += char * count
    if plain:
        parts.append(repr(plain))
    return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]
