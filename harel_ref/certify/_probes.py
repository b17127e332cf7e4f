"""The probes: two fixed programs past the sizes the searches draw (SPEC.md C13a).

The lockstep searches draw backlogs of up to 256 groups, or 128 messages in one group, and up
to 128 claims in a row: past the pages of 100 rows that stores read, and no further, because
every claim looks at every group (a drain after a backlog of n groups costs n**2), and every
example of every search pays for what it draws.  Limits that stores have at about a thousand
lie past that: SQLite's old limit of 999 bound parameters in a ``NOT IN (?, ...)`` list, a page
of 1,000 rows, a buffer of 1,024, a retry counter that gives up at the 1,000th nack.

So a search that publishes backlogs (the shared search, and those of the properties whose
rules include ``backlog`` and ``claim_many``), once Hypothesis's examples found nothing, runs
each probe once more, as an example: its steps replayed as a report's reproduction is
(:func:`~._reduce.replayed`), judged in lockstep like any example.  After, not before: a bug
that a small example shows is found and shrunk by Hypothesis, not shown at a probe's size.

- **many in flight**: a backlog of one group more than :data:`PROBE_SIZE`, each of one
  message; that many claims in a row, each lease kept; one more claim, which takes the group
  left and nacks it at once, so that it is free and claimed last (R5); then two claims: the
  first must find that group, behind all the others in flight in claim order (R4), and the
  second must find nothing.  No claim may take a group already in flight (R2);
- **one long group**: a backlog of one group of :data:`PROBE_SIZE` messages, then as many
  claims in a row, each lease nacked at once: its head is nacked that many times and stays the
  head (R8), and the drain at the end must find every message.

A probe that fails is the search's failure, with its steps as they are (each replay of a probe
is thousands of calls: its steps are not taken away one at a time, as C7 takes a shrunk
example's).  A probe that meets a bug already found (a fact set aside, SPEC.md C5) is set aside
and the next one runs, so a later pass of the search, with that bug taken as known, looks on.
What a probe reached counts in the evidence as sizes only.  The probes run at the profiles that
set a ``probe`` size (standard and thorough), and not on a wall clock, whose searches are sized
down already (a remote service: SQS).
"""

from __future__ import annotations

from harel_ref.stateful._machine import Choices

__all__ = ["PROBE_SIZE", "probe_programs"]

PROBE_SIZE = 1_100
"""Past 999, 1,000 and 1,024, the limits stores are known to have about there."""

_RULES = frozenset({"backlog", "claim_many"})


def probe_programs(machine: type, size: int) -> list[list[str]]:
    """The probes of ``size`` for the lockstep ``machine``, each as its steps (``state = ...``
    first, ``state.teardown()`` last); none for a size of 0, a machine that does not draw
    backlogs, or a transport on a wall clock."""
    caps = machine.backend.capabilities
    choices = Choices.of(caps)
    if not size or not choices.backlogs or caps.clock == "wall" or not _RULES <= machine.rules_on:
        return []
    visibility = max(choices.visibilities)  # no lease lapses while the claims go on
    start = [f"state = {machine.__name__}()"]  # its clock at START, its ids the plain ones: no begin

    def backlog(groups: int, depth: int) -> str:
        return f"state.backlog(shape=({groups}, {depth}), events='numbered', priority=0, routing_key=None, via=0)"

    def claims(count: int, then: str) -> str:
        return f"state.claim_many(count={count}, then={then!r}, visibility={visibility!r}, via=0)"

    return [
        [*start, backlog(size + 1, 1), claims(size, "hold"), claims(1, "nack now"), claims(2, "hold"), "state.teardown()"],
        [*start, backlog(1, size), claims(size, "nack now"), "state.teardown()"],
    ]
