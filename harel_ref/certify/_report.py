"""The certification report: one verdict per property, as JSON for machines and Markdown
for people."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harel_ref.stateful import Capabilities
from harel_ref.stateful._facts import FAULTS, KINDS, Fact, ShowsAFact
from harel_ref.stateful._properties import CONTRACT

from ._regression_text import LONG

__all__ = ["CONTRACT", "EXIT_CODES", "LEVELS", "Failure", "PropertyVerdict", "Report", "VERDICTS", "regression_file",
           "timeline_file"]

VERDICTS = ("passed", "failed", "not applicable", "unknown")
Verdict = Literal["passed", "failed", "not applicable", "unknown"]

EXIT_CODES = {"passed": 0, "failed": 1, "usage": 2, "unknown": 3}
"""What ``harel-ref certify`` exits with: every property passed or not applicable (0), some
property failed (1), the command was wrong (2), some property unknown and none failed (3)."""


# CONTRACT: the properties of the ``contract`` level (SPEC.md R21), what harel itself promises
# of a transport, from the property table.  The ``strict`` level is every property: fencing, the
# tie-break, bad input, close and routing are what harel-ref specifies beyond harel.

LEVELS = {"contract": "harel contract", "strict": "harel-ref strict"}
"""The conformance levels, and how a report names them."""

SAYS_ITSELF = FAULTS - {"raised"}
"""The kinds of a failure whose answer is a fault of the transport (harel_ref.stateful._async): the
answer says what happened (``hung: claim did not return within 30 s``), no model is involved."""

STOPS = frozenset({"hung", "crashed"})
"""The kinds of a failure after which the search may not have gone on (a hung transport, a
dead branch process): its example is then shown as found, not shrunk."""


def in_level(prop: str, level: str) -> bool:
    """Whether ``prop`` counts at ``level``."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; choose from {list(LEVELS)}")
    return level == "strict" or prop in CONTRACT


def timeline_file(prop: str) -> str:
    """The name of the picture of a property's concurrent failure, beside REPORT.md."""
    return f"timeline-{prop}.svg"


BRANCHES = {
    "both": "processes and threads (tasks), run by run",
    "processes": "processes",
    "threads": "threads (tasks)",
}
"""Where the concurrent search runs the branches of a program (SPEC.md C9): ``both`` unless
told, where the transport allows it."""


ECHO = "another property's bug, met in this search and set aside: another search shrinks it (SPEC.md C5)"
"""Why a focused search's failure is left unshrunk when it is an echo of another property's bug."""


@dataclass(frozen=True)
class Failure(ShowsAFact):
    """A counterexample: the fact seen (what the model allows beside the answer, at which step),
    and the shrunk steps that show it.  Which property it counts against is its verdict's."""

    fact: Fact  # what was seen (harel_ref.stateful._facts)
    found_by: str  # the search that found it: a property's own, "shared", "concurrent" or "soak"
    steps: tuple[str, ...]  # the shrunk steps as Hypothesis printed them
    reproduction: str  # runnable Python that replays them ("" if shrinking was cut short)
    replay: str | None  # the harel-ref command that runs this search again
    flaky: bool = False  # the example did not fail again when Hypothesis replayed it
    timeline: str = ""  # a concurrent failure's history, a line per call ("<<" marks the culprits)
    timeline_svg: str = ""  # the same as a picture (written beside REPORT.md)
    history: tuple[dict[str, Any], ...] = ()  # the records of the calls the timeline shows
    unshrunk: str = ""  # what stopped its shrinking before the end ("the shrink limit (120 s)"), if anything
    regression: str = ""  # a pytest module in the transport's own calls that fails until it is fixed
    no_regression: str = ""  # why there is no regression test, where there is none

    @property
    def echo(self) -> bool:
        """Whether a focused search met it as another property's bug and told it unshrunk (SPEC.md
        C5): it counts against that bug's property, never its finder's."""
        return self.unshrunk == ECHO

    def to_dict(self) -> dict[str, Any]:
        """As report.json gives it: the fact's fields first (its ``kind``, the ``step`` with what
        came before it, ``expected``, ``answered``, ``state``), then how to see it again."""
        fact = dataclasses.asdict(self.fact)
        rest = {name: value for name, value in dataclasses.asdict(self).items() if name != "fact"}
        return {**fact, "step": self.step, "says": KINDS[self.kind], **rest}

    def summary(self) -> str:
        text = f"{self.step}: the model allows {self.expected}; the transport answered {self.answered}"
        if self.kind in SAYS_ITSELF:
            text = f"{self.step}: {self.answered}"
        text = " ".join(text.split())
        return text if len(text) <= 220 else text[:217] + "..."


@dataclass(frozen=True)
class PropertyVerdict:
    """The verdict on one property, why, and what it cost.  ``evidence``: how often its searches
    reached each situation its rules are about (``harel_ref.stateful._properties``, a row's
    ``evidence``); a pass whose situation was never reached says so in its reason.  ``largest``:
    the largest sizes its searches reached (groups at a claim, messages in one group, nacks of
    one message, workers in one example, branches in one program: SPEC.md C13).  ``drawn``: how
    often its searches drew each family of values (``ids case``: examples whose group ids were
    of that family; ``keys separators`` likewise; ``events 65536 bytes``: events published).
    ``consequences``: for a failure, the other properties whose searches it disturbed (their
    verdicts are unknown, and say so); fix this one first."""

    property: str
    verdict: Verdict
    reason: str
    seconds: float
    examples: int
    failure: Failure | None = None
    evidence: dict[str, int] = field(default_factory=dict)
    consequences: tuple[str, ...] = ()
    largest: dict[str, int] = field(default_factory=dict)
    drawn: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """Everything a certification found.  ``exit_code`` is what the CLI exits with."""

    transport: str
    capabilities: Capabilities
    is_async: bool
    profile: Any  # the engine's Profile
    seed: int
    verdicts: tuple[PropertyVerdict, ...]
    seconds: float
    replay: str | None
    descriptions: dict[str, str] = field(default_factory=dict)
    branches: str = "threads"  # where the concurrent search ran its branches (threads, processes, both)
    soak: float | None = None  # seconds of soak, if one ran
    level: str = "strict"  # the conformance level the outcome and the exit code follow
    shared: tuple[str, ...] = ()  # the properties a shared lockstep search covered (SPEC.md C5)

    def verdict(self, prop: str) -> PropertyVerdict:
        for verdict in self.verdicts:
            if verdict.property == prop:
                return verdict
        raise KeyError(f"no verdict for {prop!r} in this report; it has {[v.property for v in self.verdicts]}")

    @property
    def outcome(self) -> Literal["passed", "failed", "unknown"]:
        """The outcome at the report's ``level``."""
        return self.outcome_at(self.level)

    def outcome_at(self, level: str) -> Literal["passed", "failed", "unknown"]:
        """failed if a property of ``level`` failed, else unknown if one is unknown (or none of
        them was selected), else passed."""
        found = {v.verdict for v in self.verdicts if in_level(v.property, level)}
        return "failed" if "failed" in found else "unknown" if "unknown" in found or not found else "passed"

    def failed_at(self, level: str) -> list[str]:
        return [v.property for v in self.verdicts if v.verdict == "failed" and in_level(v.property, level)]

    def levels_line(self) -> str:
        """Both conformance levels in one line: ``harel contract: passed; harel-ref strict:
        failed (fencing, bad-input)``."""
        parts = []
        for level, shown in LEVELS.items():
            failed = self.failed_at(level)
            if not any(in_level(v.property, level) for v in self.verdicts):
                parts.append(f"{shown}: unknown (none of its properties was selected)")
                continue
            parts.append(f"{shown}: {self.outcome_at(level)}" + (f" ({', '.join(failed)})" if failed else ""))
        return "; ".join(parts)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    @property
    def failures(self) -> list[Failure]:
        """The failures of the failed properties (a consequence's counterexample is on its
        unknown verdict)."""
        return [v.failure for v in self.verdicts if v.failure is not None and v.verdict == "failed"]

    # --- JSON --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        import hypothesis

        from harel_ref import __version__

        return {
            "transport": self.transport,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "level": self.level,
            "levels": {level: self.outcome_at(level) for level in LEVELS},
            "capabilities": dataclasses.asdict(self.capabilities),
            "is_async": self.is_async,
            "profile": dataclasses.asdict(self.profile),
            "seed": self.seed,
            "branches": self.branches,
            "shared": list(self.shared),
            "soak": self.soak,
            "replay": self.replay,
            "seconds": round(self.seconds, 3),
            "versions": {"harel_ref": __version__, "hypothesis": hypothesis.__version__},
            "properties": [
                {
                    **dataclasses.asdict(v),
                    "seconds": round(v.seconds, 3),
                    "checks": self.descriptions.get(v.property, ""),
                    "failure": None if v.failure is None else v.failure.to_dict(),
                }
                for v in self.verdicts
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False, default=repr)

    # --- Markdown ----------------------------------------------------------------------------

    def _drawn_markdown(self) -> list[str]:
        """How often the searches behind each verdict drew each family of values, a line for
        the verdicts that drew alike (those of one shared search)."""
        alike: dict[str, list[str]] = {}
        for v in self.verdicts:
            if v.drawn:
                alike.setdefault(_drawn(v.drawn), []).append(v.property)
        if not alike:
            return []
        return ["", "How often they drew each family of values (SPEC.md C13: examples for ids and keys, "
                "publishes for events):", "", *(f"- **{', '.join(props)}**: {line}" for line, props in alike.items())]

    def to_markdown(self) -> str:
        data = self.to_dict()
        counts = {name: sum(v.verdict == name for v in self.verdicts) for name in VERDICTS}
        caps = self.capabilities
        declared = [name for name in ("priority", "routing", "parking", "durable", "shared") if getattr(caps, name)]
        lines = [
            f"# Certification of `{self.transport}`",
            "",
            f"**Outcome at the {LEVELS[self.level]} level: {self.outcome}** (exit code {self.exit_code}): "
            + ", ".join(f"{n} {name}" for name, n in counts.items()) + ".",
            "",
            f"**Conformance levels:** {self.levels_line()}.",
            "",
            f"- capabilities: {', '.join(declared) or 'none of the optional ones'}; "
            f"fairness `{caps.fairness}`; clock `{caps.clock}`; protocol `{caps.protocol}`; acks "
            f"`{caps.acks}`; {'async' if self.is_async else 'sync'}",
            f"- profile `{self.profile.name}` ("
            + (f"a shared lockstep search of {self.profile.shared_examples} examples for {len(self.shared)} "
               "properties, and their own searches only if it finds anything; " if self.shared else "")
            + f"{self.profile.max_examples} examples of up to "
            f"{self.profile.step_count} steps per property; {self.profile.programs} concurrent "
            f"programs, each run up to {self.profile.repeats} times, branches in "
            f"{BRANCHES[self.branches]}"
            + (f"; a soak of {self.soak:g} s" if self.soak else "")
            + f"), seed {self.seed}, {self.seconds:.1f} s; harel-ref {data['versions']['harel_ref']}, "
            f"Hypothesis {data['versions']['hypothesis']}",
        ]
        if self.replay:
            lines.append(f"- run again: `{self.replay}`")
        lines += ["", "| property | level | verdict | time | detail |", "| --- | --- | --- | --- | --- |"]
        for v in self.verdicts:
            detail = v.reason.replace("|", "\\|").replace("`", "'")
            level = "contract" if in_level(v.property, "contract") else "strict"
            lines.append(f"| {v.property} | {level} | **{v.verdict}** | {v.seconds:.1f} s | {detail} |")
        reached = [v for v in self.verdicts if v.evidence or v.largest]
        if reached:
            lines += ["", "## What the searches reached", "",
                      "How often the searches behind each verdict reached the situations its rules are about, "
                      "and the largest sizes they reached:", ""]
            lines += [f"- **{v.property}**: " + "; ".join(
                [f"{situation}: {times}" for situation, times in v.evidence.items()]
                + ["largest: " + ", ".join(f"{size} {value}" for size, value in v.largest.items())] * bool(v.largest))
                for v in reached]
            lines += self._drawn_markdown()
        for v in self.verdicts:
            if v.failure is not None:
                lines += ["", *self._failure_markdown(v)]
        lines += ["", "## What each property checks", ""]
        lines += [f"- **{prop}**: {what}" for prop, what in self.descriptions.items()]
        return "\n".join(lines) + "\n"

    def _failure_markdown(self, verdict: PropertyVerdict) -> list[str]:
        f = verdict.failure
        assert f is not None
        heading = "failed" if verdict.verdict == "failed" else verdict.reason.partition(":")[0]
        lines = [
            f"## {verdict.property}: {heading}",
            "",
            f"Found by the `{f.found_by}` search; what it saw: `{f.kind}`, {KINDS[f.kind]}"
            + (", flaky: it did not fail again on replay" if f.flaky else "") + ".",
            "",
            f"- the step: `{f.step}`",
            f"- the model allows: {f.expected}",
            f"- the transport answered: {f.answered}",
        ]
        if verdict.consequences:
            shown = ", ".join(f"`{prop}`" for prop in verdict.consequences)
            lines += ["", f"Consequences: {shown}. Their searches met what this failure explains, or stopped at "
                      "it, so their verdicts are unknown (each says which); fix this one and certify again."]
        elif verdict.verdict != "failed":
            lines += ["", f"This is not counted as a failure of its own: {verdict.reason}"]
        if f.state:
            lines += ["", "The queue per the model at that step:", "", "```", f.state, "```"]
        if f.timeline:
            lines += [
                "", "The history (one lane per caller; the horizontal axis is the order of the calls' "
                "starts and ends, so bars overlap exactly when the calls did; red: the calls blamed "
                "and their leases):", "", f"![timeline of the {verdict.property} failure]({timeline_file(verdict.property)})",
                "", "```", f.timeline, "```",
            ]
        if f.unshrunk:
            more = "; `--shrink-limit` gives it more time" if "shrink limit" in f.unshrunk else ""
            lines += ["", f"(Shrinking stopped at {f.unshrunk}: the counterexample is shown as it was found, or as "
                      f"far as it had been shrunk{more}.)"]
        if f.regression and f.regression.count("\n") > LONG:
            lines += ["", f"A regression test in the transport's own calls, {f.regression.count(chr(10))} lines long: "
                      f"`--write-tests DIR` writes it as `{regression_file(verdict.property)}` (report.json has it as "
                      "`regression`); it fails until the bug is fixed."]
        elif f.regression:
            lines += ["", "A regression test in the transport's own calls (`--write-tests DIR` writes it as "
                      f"`{regression_file(verdict.property)}`): it fails until the bug is fixed.", "", "```python",
                      f.regression.rstrip("\n"), "```"]
        elif f.no_regression:
            lines += ["", f"(No regression test: {f.no_regression}.)"]
        if f.reproduction:
            lines += ["", "Runnable reproduction (the shrunk steps):", "", "```python", f.reproduction, "```"]
        elif f.steps:  # a program that made the transport raise outside a judged call
            lines += ["", "The program it ran:", "", "```python", *f.steps, "```"]
        elif f.found_by == "soak":
            lines += ["", "(A soak is random and timed: it is not replayed step by step; run it again below.)"]
        elif f.kind in STOPS:
            lines += ["", f"(The search stopped when the transport {f.kind}: it is not called again after "
                      "that, so the example was not shrunk; replay with the command below.)"]
        elif not f.unshrunk:
            lines += ["", "(Shrinking was cut short by the time budget; replay with the command below.)"]
        if f.replay:
            lines += ["", f"Replay this search: `{f.replay}`"]
        return lines

    # --- files -------------------------------------------------------------------------------

    def write(self, directory: str | Path) -> tuple[Path, Path]:
        """Write ``report.json`` and ``REPORT.md`` into ``directory``, and a timeline picture
        per concurrent failure (``timeline-<property>.svg``, replacing those of an earlier
        report); return the paths of the first two."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob("timeline-*.svg"):
            old.unlink()
        for verdict in self.verdicts:
            if verdict.failure is not None and verdict.failure.timeline_svg:
                (directory / timeline_file(verdict.property)).write_text(verdict.failure.timeline_svg, encoding="utf-8")
        json_path, md_path = directory / "report.json", directory / "REPORT.md"
        json_path.write_text(self.to_json() + "\n", encoding="utf-8")
        md_path.write_text(self.to_markdown(), encoding="utf-8")
        return json_path, md_path

    def write_tests(self, directory: str | Path) -> list[Path]:
        """Write each failure's regression test into ``directory`` as ``test_<property>.py``
        (replacing one of an earlier run); return their paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for verdict in self.verdicts:
            if verdict.verdict == "failed" and verdict.failure is not None and verdict.failure.regression:
                path = directory / regression_file(verdict.property)
                path.write_text(verdict.failure.regression, encoding="utf-8")
                written.append(path)
        return written


def regression_file(prop: str) -> str:
    """The file ``--write-tests`` writes a property's regression test to."""
    return f"test_{prop.replace('-', '_')}.py"


def _drawn(counts: dict[str, int]) -> str:
    """``counts`` of :attr:`PropertyVerdict.drawn` as one line per kind: ``ids: plain 60, case
    7; events: short text 300, 65536 bytes 4``."""
    kinds: dict[str, list[str]] = {}
    for name, count in counts.items():
        kind, family = name.split(" ", 1)
        kinds.setdefault(kind, []).append(f"{family} {count}")
    return "; ".join(f"{kind}: {', '.join(families)}" for kind, families in kinds.items())
