"""The values the lockstep machine draws (SPEC.md C13): ids as near-collisions, events across
the sizes stores break at, durations and clocks across magnitudes, arguments in every shape.

Hypothesis keeps examples small and simple by design, and a store's bugs of data are in the
values it is given: a collation that folds case or ignores trailing spaces, ``LIKE`` where
``=`` was meant, a column cut at 255 characters or 64 KiB, a deadline kept as a 32-bit float,
leases kept in 32-bit milliseconds.  So the searches do not draw ids and durations at random:

- most examples take their group ids from 1 or 2 *families* of values that a careless store
  merges or splits (``job``, ``Job`` and ``JOB``; ``a_c`` and ``abc``; ``é`` in NFC and in
  NFD), always with the pair of each that such a store merges, and their routing keys from the
  pairs of 1 to 3 families.  The others take the plain family (``g1``, ``g2``, ...) whole,
  and a failure shrinks to it when the family does not matter;
- events are short text, text a JSON or encoding step would change, or long runs of one
  character at the lengths stores cut at (255, 4 KiB, 32 KiB, 64 KiB, 1 MiB, and one past);
- a step may publish a backlog at once (up to 256 groups, or 128 messages in one group) or
  claim up to 128 times in a row, holding, nacking or acking each lease: the sizes where
  stores page, cap and count;
- visibilities and delays run from ~1 ms (2**-10 s) to 10**7 s, some given as ``int``; the
  clock starts at 1000, near 0, at today's epoch or far in the future.  Every one of them is
  a power-of-two multiple, so ``now + visibility`` is exact in floating point at each.  The
  everyday ones are drawn most (:func:`weighted`).

Each choice is a tuple whose first item is the simplest: Hypothesis shrinks a ``sampled_from``
towards its first item, so a failure found with a 1 MiB event or a clock at 2**40 shrinks by
whole steps to the smallest size and magnitude that still fail.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from hypothesis import strategies as st

from ._backend import Capabilities, accepted_groups

__all__ = [
    "BACKLOGS", "CLAIM_RUNS", "CLOCK_STARTS", "DELAYS", "EPOCH", "EVENT_SIZES", "GROUP_FAMILIES", "KEY_FAMILIES", "KeySet", "LONG", "OnePass",
    "STEPS", "TICK", "VISIBILITIES", "WALL_BACKLOGS", "WALL_CLAIM_RUNS", "WORKERS", "WORKER_FAMILIES", "event_family", "event_strategy", "families_drawn", "families_of", "group_families", "pair_in_order",
    "near_collisions", "reshaped", "routing_key_pool", "SHAPES", "shaped", "shaped_keys", "weighted",
]

TICK = 2.0**-10
"""One tick of the fake clock (~1 ms), the shortest duration drawn."""

GROUP_FAMILIES: dict[str, tuple[str, ...]] = {
    "plain": (),  # the backend's accepted plain ids (``accepted_groups``): g1, g2, g3, grüppe-✓
    "case": ("job", "Job", "JOB", "jOb"),
    "LIKE wildcards": ("a_c", "abc", "a%c", "a\\_c"),
    "quotes": ("it's", "its", 'it"s', "it''s"),
    "spaces": ("g", "g ", " g", "g\t"),
    "NUL": ("g", "g\x00", "g\x00h", "\x00g"),
    "astral": ("\U0001d524", "\U0001f600", "\U0001f601", "\U0010fffd"),
    "Unicode normal forms": ("\u00e9", "e\u0301", "\u00c5", "\u212b"),  # é NFC and NFD, Å and the angstrom sign
    "numeric-looking": ("007", "7", "7.0", "1e3"),
    "long": ("x" * 255, "x" * 256, "x" * 1024 + "a", "x" * 1024 + "b"),
    "equal 32-bit hashes": ("plumless", "buckeroo", "Aa", "BB"),  # CRC-32; Java's String.hashCode
}
"""Group ids that a careless store merges (case, collation, normal form, a ``LIKE`` pattern, a
C string cut at NUL, a column cut at 255 characters, a lock or shard keyed by a 32-bit hash of
the id) or that break a statement (quotes)."""

KEY_FAMILIES: dict[str, tuple[str, ...]] = {
    "plain": ("blue", "green"),
    "case": ("blue", "Blue", "BLUE"),
    "separators": ("a,b", "a", "b", "a b"),
    "quotes and braces": ("o'k", "ok", "{ok}", '"ok"'),
    "LIKE wildcards": ("k_1", "kx1", "k%1"),
    "Unicode normal forms": ("\u00e9", "e\u0301"),
}
"""Routing keys likewise: a store that joins a claim's keys with commas, or splices them into
an array literal, matches keys it was not given."""

WORKER_FAMILIES: dict[str, tuple[str, ...]] = {
    "plain": ("w1", "w2"),
    "case": ("w", "W"),
    "separators": ("w:1", "w", "w:"),
    "Unicode normal forms": ("\u00e9", "e\u0301"),
}
"""Worker ids: a store that keys leases by worker, or builds tokens from it, merges these."""
WORKERS = tuple(dict.fromkeys(worker for family in WORKER_FAMILIES.values() for worker in family))
"""The worker ids a claim draws from: every family's, plain first.  (Workers are not drawn per
example as group ids are: which worker claims matters to few stores.)"""

EVENT_TEXTS = ('{"a": 1}', "null", "[]", "0", "\r\n", "\n", "e\u0301", "\ufeff", " e", "e ", "\x00", "\\u0000")
"""Events that a JSON, encoding or trimming step would change."""

EVENT_SIZES = (255, 256, 4096, 4097, 32_768, 65_535, 65_536, 65_537, 1_048_577)
"""The lengths in UTF-8 bytes stores cut at (a 255-character column, pages of 4 KiB, a 64 KiB
``TEXT``, a 1 MiB request), and one past each."""

LONG = 32_768
"""An event of this many bytes or more counts as long in the evidence (SQS takes no 64 KiB one)."""

ODDS = 3
"""How many times as often a search draws each everyday value as each far one."""


def weighted(everyday: tuple, far: tuple) -> tuple:
    """A choice for ``sampled_from`` that draws each of ``everyday`` :data:`ODDS` times as
    often as each of ``far``.  The far values find bugs of magnitude; drawn as often as the
    everyday ones they starve the searches of the short sequences that find the rest (the quick
    profile stopped finding a parked group claimable early).  The first value stays first, so a
    failure still shrinks to it."""
    return tuple(everyday) * ODDS + tuple(far)


SUB_MS = 0.0013
"""A duration that is no whole number of milliseconds, nor a power of two: every other is, so a
store that keeps deadlines in whole milliseconds (or microseconds of a float's sum) would keep
each of theirs exactly, and end this one's up to half a millisecond early."""
VISIBILITIES = weighted((0.25, 0.5, 1, 2.0, 5), (TICK, SUB_MS, 3600, 86_400.0, 10_000_000))
DELAYS = weighted((0.125, 0.5, 1, 3.0), (TICK, SUB_MS, 3600.0, 10_000_000))
STEPS = weighted((TICK, 0.125, 0.5, 1.0, 4.0), (3600.0,))
"""Visibilities, delays and clock steps in seconds.  Some are ``int``: the Protocol takes both
(R13).  The ones past a few seconds end only where a step jumps to a deadline."""

BACKLOGS = weighted(((2, 1), (3, 2), (1, 4)) * 2, ((128, 1), (1, 128), (256, 1)))
"""A backlog a step publishes at once, as (new groups, messages in each): past the pages of 100
a store reads groups or messages in (Mongo's first batch is 101 documents), a group capped at
100, a buffer of fixed size.  No more than 256 groups: the drain at the end of an example
claims each message, and each claim looks at every group (in the transport and in the model),
so a backlog of n groups costs n**2.  The everyday shapes are drawn six times as often as each
far one.  With (1024, 1) and (1, 1024) as well, the default certification of the in-memory
transport took 44 s instead of 16 s; with the everyday shapes three times as often, 65 s."""
WALL_BACKLOGS = weighted(BACKLOGS[:3], ((128, 1), (1, 128)))
"""On a wall clock every message costs a round trip and the drain waits: 128 messages at most."""
CLAIM_RUNS = weighted((2, 4), (16, 128))
"""How many claims a step makes in a row: 8 workers or more holding leases at once, or one
message nacked past the few nacks a retry counter allows."""
WALL_CLAIM_RUNS = weighted((2, 4), (16,))
"""On a wall clock each claim and nack is a round trip: 16 in a row at the most."""

BRANCH_COUNTS = weighted((2, 3), (4, 5, 6))
"""How many branches a concurrent program runs at once: past the 3 callers a pool of
connections, a semaphore or a table of slots sized for a few workers holds."""

EPOCH = 1_700_000_000.0
"""Today's epoch, where a 32-bit float is 128 s coarse."""
CLOCK_STARTS = weighted((1000.0,), (0.0, EPOCH, 2.0**40))
"""Where the clock starts: the old fixed 1000, 0 (where a claim's stamp equals a never-claimed
group's, R5), today's epoch and the year 36812."""


def families_of(families: dict[str, tuple[str, ...]], plain: tuple[str, ...],
                accepts=lambda value: True) -> dict[str, tuple[str, ...]]:
    """``families`` with ``plain`` as the plain one and each family's values kept to those
    ``accepts`` takes; families left with fewer than two values are dropped."""
    kept = {}
    for name, values in {**families, "plain": plain}.items():
        accepted = tuple(value for value in values if accepts(value))
        if len(accepted) >= 2:
            kept[name] = accepted
    return {"plain": kept.pop("plain"), **kept}


def group_families(caps: Capabilities) -> dict[str, tuple[str, ...]]:
    """The group id families a transport with ``caps`` accepts (``Capabilities.group_ids``)."""
    return families_of(GROUP_FAMILIES, accepted_groups(caps), caps.accepts_group_id)


def near_collisions(families: dict[str, tuple[str, ...]], most: int = 4) -> st.SearchStrategy[list[str]]:
    """An example's pool: in half the examples the first (plain) family's first ``most``
    values, as the searches drew before C13, else the meetings (:func:`_meeting`, 2 or
    3 values) of 1 or 2 other families at once, as routing keys are drawn
    (:func:`routing_key_pool`).

    One family per example, picked by an integer, came in clumps however the integer mapped to
    it: the shared search of 563 examples at seed 0 drew ``case`` 55 times and ``spaces`` 5,
    and a store that ignores trailing spaces passed it.  A list of families, each drawn from
    ``sampled_from``, came more evenly (22 to 56 examples of 400 each), and a failure shrinks
    to the one family it needs (or to the plain pool, where the family does not matter).

    No more than two families, of three values each: a pool of 2 to 6 ids, mostly 4, as
    before.  With up to three of four each, examples spread their steps over more groups, and
    the search for a stale ack of harel's ``make`` example passed at seed 0."""
    plain, *others = families.values()
    plain_pool = st.just(list(plain[:most]))
    if not others:
        return plain_pool
    meetings = st.lists(st.sampled_from(others), min_size=1, max_size=2, unique=True).flatmap(
        lambda drawn: st.tuples(*(_meeting(family, 3) for family in drawn)))
    # flatmap to just, not map: Hypothesis prints a mapped value as the call that made it
    # where that is shorter than its repr (a pool of long ids printed as a lambda's call)
    mixed = meetings.flatmap(lambda pools: st.just(list(dict.fromkeys(value for pool in pools for value in pool))))
    # plain for every even integer of a wide range: integers(0, 1) drew 1 two times in three
    # (Hypothesis prefers draws it has not made), and the plain pool's share fell from a half
    return st.integers(0, 2**16 - 1).flatmap(lambda drawn: mixed if drawn % 2 else plain_pool)


# Built once per value and kept: a flatmap builds the strategy it draws from at every draw, and
# Hypothesis validates each one it has not seen, its parts first (7-8 % of a certification's
# CPU).  The lambdas stay as they were: Hypothesis labels a flatmap by its function's code, and
# a label changed changes which examples a seed draws.
@functools.lru_cache(maxsize=None)
def _meeting(family: tuple[str, ...], most: int) -> st.SearchStrategy[list[str]]:
    """A pool of ``family`` that holds its first two values, the pair a careless store merges
    (``job`` and ``Job``, ``g`` and ``g ``), in either order, and up to ``most - 2`` more: a
    pool of two drawn from four held the pair one time in six."""
    pair = list(family[:2])
    rest = st.lists(st.sampled_from(family[2:]), max_size=min(most, len(family)) - 2, unique=True) if family[2:] else st.just([])
    return st.booleans().flatmap(lambda flip: rest.flatmap(lambda more: st.just((pair[::-1] if flip else pair) + more)))


def families_drawn(pool: list[str] | tuple[str, ...], families: dict[str, tuple[str, ...]]) -> list[str]:
    """The names of the near-collision families whose pair (first two values) ``pool`` holds,
    or ``["plain"]``: what the evidence counts an example's ids or keys as (SPEC.md C13)."""
    return [name for name, values in families.items() if name != "plain" and set(values[:2]) <= set(pool)] or ["plain"]


def pair_in_order(pool: list[str] | tuple[str, ...], family: tuple[str, ...]) -> bool:
    """Whether ``pool`` holds ``family``'s pair (its first two values) in the family's order:
    :func:`_meeting` draws either order alike, and the machine starts the examples of one
    order with a message in each id (``begin``)."""
    first, second = family[:2]
    return first in pool and second in pool and list(pool).index(first) < list(pool).index(second)


def event_family(event: str) -> str:
    """What the evidence counts a published event as: ``empty``, ``changed by JSON, encoding
    or trimming`` (:data:`EVENT_TEXTS`), ``64 KiB or more`` (its band of size in UTF-8 bytes,
    from 255 bytes) or ``short text``."""
    if not event:
        return "empty"
    if event in EVENT_TEXTS:
        return "changed by JSON, encoding or trimming"
    if len(event) * 4 >= EVENT_SIZES[0] and (size := len(event.encode("utf-8"))) >= EVENT_SIZES[0]:
        return next(f"{name} or more" for least, name in reversed(_EVENT_BANDS) if size >= least)
    return "short text"


_EVENT_BANDS = ((255, "255 bytes"), (4095, "4 KiB"), (32_768, "32 KiB"), (65_535, "64 KiB"), (1_048_575, "1 MiB"))
"""Bands of event sizes for the evidence, each from one a store cuts at (a character of 2 to
4 bytes repeated to a size lands a byte or two under it)."""


def routing_key_pool() -> st.SearchStrategy[list[str]]:
    """An example's routing keys: in half the examples the plain ones (``blue``, ``green``),
    in the others the pairs of 1 to 3 families of :data:`KEY_FAMILIES` (``a,b`` and ``a``,
    ``blue`` and ``Blue``).  Several families at once, unlike group ids: only the searches
    that judge routing use keys, and one family in ten examples left a search of 130 examples
    at seed 0 with no separators at all, where a claim by every key but ``a`` is the one that
    finds ``a,b`` split at commas (``claim_other_keys``)."""
    plain, *others = KEY_FAMILIES.values()
    pairs = st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True).flatmap(
        lambda families: st.just(list(dict.fromkeys(key for family in families for key in family[:2]))))
    return st.integers(0, 1).flatmap(lambda mixed: pairs if mixed else st.just(list(plain)))


def shaped_keys(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """A claim's ``routing_keys``: 1 to 3 of ``keys`` (repeats allowed, R13) as a list, a tuple,
    a set or an iterator, each of which the Protocol takes."""
    return st.tuples(st.lists(keys, min_size=1, max_size=3), st.sampled_from(SHAPES)).map(lambda drawn: shaped(*drawn))


SHAPES = ("list", "tuple", "set", "iterator")


def shaped(keys: list[str], shape: str) -> Any:
    """``keys`` as the Protocol takes them in ``shape``, one of :data:`SHAPES`."""
    return {"list": list, "tuple": tuple, "set": KeySet, "iterator": OnePass}[shape](keys)


class KeySet(set):
    """A set of routing keys that iterates and prints in sorted order.  A plain set's order
    follows the process's string hashes, so a search run in another process (``--jobs``)
    would see and print the keys in another order, and its report would differ."""

    def __iter__(self):
        return iter(sorted(set.__iter__(self)))

    def __repr__(self) -> str:
        return "{" + ", ".join(map(repr, self)) + "}" if self else "set()"


class OnePass:
    """An iterator over routing keys that shows as ``iter([...])``, the code that makes one, so
    that a printed counterexample runs as it is."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = list(keys)
        self._rest = iter(self._keys)

    def __iter__(self) -> OnePass:
        return self

    def __next__(self) -> str:
        return next(self._rest)

    def __repr__(self) -> str:
        return f"iter({self._keys!r})"


def reshaped(given: Any, keys: tuple[str, ...]) -> Any:
    """``keys`` in the shape ``given`` had (``given`` may be an iterator already read)."""
    if isinstance(given, (list, tuple, set, frozenset)):
        return type(given)(keys)
    return OnePass(keys)


def event_strategy(event_bytes: int) -> st.SearchStrategy[str]:
    """Events: empty, short text, the texts of :data:`EVENT_TEXTS`, or one character repeated
    to a length of :data:`EVENT_SIZES` in UTF-8 bytes (none past ``event_bytes``, if not 0)."""
    characters = st.characters(exclude_categories=["Cs"])
    sizes = tuple(size for size in EVENT_SIZES if not event_bytes or size <= event_bytes)
    long = characters.flatmap(lambda character: _repeated(character, sizes)) if sizes else st.nothing()
    return st.one_of(st.just(""), st.text(characters, max_size=12), st.sampled_from(EVENT_TEXTS), long)


@functools.lru_cache(maxsize=4096)  # kept as _meeting is
def _repeated(character: str, sizes: tuple[int, ...]) -> st.SearchStrategy[str]:
    """``character`` repeated to one of ``sizes`` in UTF-8 bytes, or the most that fit."""
    counts = st.sampled_from(sizes).flatmap(lambda size: st.just(max(1, size // len(character.encode("utf-8")))))
    return st.builds(_times, st.just(character), counts)


def _times(character: str, count: int) -> str:
    return character * count


# Hypothesis prints a built value as the call that built it where that is shorter than its
# repr: named so, an event of 1 MiB prints as ``str.__mul__('9', 1048577)``, which runs.
_times.__name__ = _times.__qualname__ = "str.__mul__"
