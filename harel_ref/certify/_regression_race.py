"""A concurrent search's failure as a regression test (issue 44, SPEC.md C14).

A race has no single call whose answer a test can assert: the answers of calls made at once are
right or wrong only together, by whether some order of the calls the specification allows gives
them.  So the test holds the shrunk program as plain calls in the Protocol's terms and asserts
the verdict of harel-ref's checker on it, through the one helper it imports,
:func:`harel_ref.check_at_once` (``stateful/_at_once.py``): the prefix in order, the branches
at once, each on a thread of its own (a task, for an asyncio transport; a process, where the
search saw the race with its branches in processes), as many runs as the search made, each on
an empty queue.  It fails while the bug is there and passes once it is
fixed; a race may need several runs to show, so the test makes them all.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from typing import Any

from harel_ref.stateful import Capabilities
from harel_ref.stateful._at_once import plain_call
from harel_ref.stateful._facts import Fact
from harel_ref.stateful.parallel import Claim, Program

from ._regression_text import _setup, docstring_text
from ._target import Target

__all__ = ["race_regression", "runs_to_show"]

ABOUT = ("Found by harel-ref's concurrent search.  The calls below run as the search ran them: the "
         "prefix in order, then the branches at once, each on {place} of its own, all started together, up to "
         "{runs} times, each time on an empty queue.  harel-ref's checker judges each run: {judged}.  It fails "
         "while the bug is there (a race: one run in {runs} that shows it is enough), and passes once it is "
         "fixed.  Run it with pytest from the directory you certified in.")

SEEN = ("The search ran this program {made} times more once it was shrunk, and {refused} of those runs showed "
        "the race: given that, {runs} runs miss it about once in a thousand{capped}.")

SEEN_NONE = ("The search ran this program {made} times more once it was shrunk, and none of those runs showed "
             "the race: it is rare, and the test may pass on some runs of it while the bug is there.  Raise "
             "runs to make it surer.")

# A race's test makes enough runs to miss the race about once in MISSED runs of the test, given
# how often it showed, but never more than MOST_RUNS (each costs the fixed transport a run).
MISSED, MOST_RUNS = 1000, 3000

RARE = ("Hypothesis ran this program once more and it did not fail again: the race is rare, so the test "
        "may pass on some runs of it while the bug is there.  Raise runs to make it surer.")

IMPORT = ('from harel_ref import check_at_once  # runs calls at once and judges them (README: "A race as a '
          'regression test")\n')


def race_regression(target: Target, program: Program | None, fact: Fact, prop: str, *, refusals: bool, runs: int,
                    ran_as: str, replay: str = "", flaky: bool = False,
                    seen: tuple[int, int] | None = None) -> tuple[str, str]:
    """The regression test of the failure ``fact`` that ``program`` showed (None: a soak's),
    its branches run as ``ran_as`` (threads, tasks or processes), judged for refusals
    (``refusals``) or histories (else), as a test module's text; or ``""`` and why there is none.
    ``runs``: the runs the search made of a program; ``seen``: of how many runs made afresh once
    it was shrunk, how many showed the race (:func:`runs_to_show` makes the test's runs of it).
    ``flaky``: Hypothesis could not make it fail again, which the test says."""
    if program is None:
        return "", "a soak's failure is a history of many calls over minutes, not a program to run again"
    in_processes = ran_as == "processes"
    if in_processes and (target.recipe is None or target.recipe.spec is None):
        return "", ("it showed with the branches in processes, which check_at_once runs only for a factory it can "
                    "import by name (module:attribute), and this one has none (a closure, or a bundled transport): "
                    "the reproduction runs them")
    summary = " ".join(f"{fact.step}: the specification allows {fact.expected}; the transport answered "
                       f"{fact.answered}".split())
    summary = docstring_text(summary if len(summary) <= 300 else summary[:297] + "...")
    judged = "no call refused where the specification allows no error" if refusals else \
        "its answers fit some order of its calls that the specification allows"
    place = "a process" if in_processes else "an asyncio task" if target.is_async else "a thread"
    runs = runs if seen is None else runs_to_show(*seen)
    about = textwrap.fill(ABOUT.format(place=place, runs=runs, judged=judged), 95)
    if seen is not None:
        capped = f" (at most {MOST_RUNS}; a rarer race is missed more often)" if runs == MOST_RUNS else ""
        text = SEEN if seen[0] else SEEN_NONE
        about += "\n\n" + textwrap.fill(text.format(made=seen[1], refused=seen[0], runs=runs, capped=capped), 95)
    about += f"\n\n{textwrap.fill(RARE, 95)}" if flaky and seen is None else ""  # else the rate says it
    about += f"\n\nThe search again: `{docstring_text(replay)}`" if replay else ""
    return "".join([
        f'"""Regression test: {summary}\n\n{about}\n"""\n\n',
        IMPORT,
        _setup(target.setup),
        _calls(program),
        f"\nCAPABILITIES = {_declared(target.capabilities)!r}\n",
        f"\n\ndef test_{prop}_{fact.kind}():\n".replace("-", "_"),
        f"    verdict = check_at_once(factory, PREFIX, BRANCHES, runs={runs}, capabilities=CAPABILITIES,\n",
        f"                            refusals={refusals}, histories={not refusals}"
        f"{', is_async=True' * target.is_async}"
        f"{f', processes={target.recipe.spec!r}' if in_processes else ''})\n",
        "    assert verdict is None, verdict\n",
    ]), ""


def runs_to_show(refused: int, made: int) -> int:
    """The runs a race's test makes, its race seen in ``refused`` of ``made`` runs made afresh
    (counted as the search counts them, until five showed it: ``failing_runs``): enough to miss
    it about once in :data:`MISSED` tests (at least 3, at most :data:`MOST_RUNS`; seen in none,
    the most).

    The rate ``refused / made`` of runs counted until a few showed it is too high: tests made
    from it, ``ln(1000) / rate`` runs, missed their race one time in 77 in a simulation (4,000
    measurements at each of the rates 1 %, 3 % and 10 %).  ``made * (MISSED ** (1 / refused) - 1)``
    runs, from the chance that many runs all miss averaged over the rates those counts leave
    likely, missed 0.4 to 1.0 times in 1,000 at rates of 0.3 % to 10 % in the same simulation."""
    if refused == 0:
        return MOST_RUNS
    return min(MOST_RUNS, max(3, math.ceil(made * (MISSED ** (1 / refused) - 1))))


def _calls(program: Program) -> str:
    """``PREFIX`` and ``BRANCHES`` as source, each claim with the name its lease goes by."""
    lines = ["", "# A claim's lease is named for where it was made: p0, p1... in the prefix, b0.0, b0.1... in",
             "# branch 0, b1.0... in branch 1 (an ack or nack names the lease it gives back).",
             "PREFIX = [", *_listed(program.prefix, "p", "    "), "]", "BRANCHES = ["]
    for number, branch in enumerate(program.branches):
        lines += ["    [", *_listed(branch, f"b{number}.", "        "), "    ],"]
    return "\n".join([*lines, "]"]) + "\n"


def _listed(ops: tuple[Any, ...], prefix: str, indent: str) -> list[str]:
    claims = 0
    lines = []
    for op in ops:
        line = f"{indent}{plain_call(op)!r},"
        if isinstance(op, Claim):
            line, claims = f"{line}  # {prefix}{claims}", claims + 1
        lines.append(line)
    return lines


def _declared(capabilities: Capabilities) -> dict[str, Any]:
    """The capabilities that differ from the defaults, as keyword arguments."""
    default = Capabilities()
    return {field.name: getattr(capabilities, field.name) for field in dataclasses.fields(Capabilities)
            if getattr(capabilities, field.name) != getattr(default, field.name)}
