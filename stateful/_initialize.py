"""A machine's ``@initialize`` rules drawn from strategies built once, not at every step.

At each of an example's first steps Hypothesis draws the initialize rules still to run from
``one_of(tuples(just(rule), fixed_dictionaries(rule.arguments)) for each rule)``, built and
validated anew each time.  With the machine's three initialize rules that building was nearly a
third of a failing certification's CPU (py-spy, a variant's focused search at quick: 222 of
720 samples in ``validate`` and ``tuples``), more than its transport's calls.

:class:`InitializeRulesBuiltOnce` hands Hypothesis the same strategy, built once per machine
class and per set of rules still to run, through the attribute Hypothesis draws every other
step from (``_rules_strategy``).  It draws the same choices under the same span labels, so a
seed finds the same examples and shrinks them alike: tests/test_hypothesis_internals.py runs a
machine both ways and compares every step of every example.  It relies on internals of
``RuleBasedStateMachine`` (that test fails naming them if a release changes them):
``_initialize_rules_to_run``, the list of initialize rules left (which ``check_invariants``
reads too: an invariant waits for the initialize rules unless marked ``check_during_init``), and
``_rules_strategy``, what a step is drawn from once that list is empty.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.strategies._internal.lazy import unwrap_strategies
from hypothesis.strategies._internal.strategies import SearchStrategy

__all__ = ["InitializeRulesBuiltOnce"]


def _as_hypothesis_builds(rules: tuple) -> SearchStrategy:
    """The strategy Hypothesis builds for an initialize step with ``rules`` left, unwrapped as
    its ``ConjectureData.draw`` unwraps it (for the label and ``do_draw``)."""
    return unwrap_strategies(st.one_of([st.tuples(st.just(rule), st.fixed_dictionaries(rule.arguments))
                                        for rule in rules]))


class _InitializeStep(SearchStrategy):
    """One initialize step of ``machine``: draws as ``built`` does, under its label, then
    takes the rule drawn off the machine's list of rules left (as Hypothesis does)."""

    def __init__(self, machine: InitializeRulesBuiltOnce, built: SearchStrategy) -> None:
        super().__init__()
        self.machine = machine
        self.built = built

    def do_validate(self) -> None:
        self.built.validate()

    def calc_label(self) -> int:
        return self.built.label

    def calc_is_empty(self, recur) -> bool:
        return recur(self.built)

    def __repr__(self) -> str:  # what Hypothesis's notes show of the strategy drawn from
        return repr(self.built)

    def do_draw(self, data) -> tuple[Any, dict]:
        rule, values = self.built.do_draw(data)
        self.machine._initialize_left.remove(rule)
        return rule, values


class InitializeRulesBuiltOnce:
    """Mix in before ``RuleBasedStateMachine``: its initialize steps are drawn from strategies
    built once per class (see the module's docstring).  Hypothesis sees no initialize rules
    left and draws every step from ``_rules_strategy``, which is the initialize step's strategy
    while any is left, then Hypothesis's own."""

    _initialize_built_once = True  # False: as Hypothesis does it (the test's control)

    def __init__(self) -> None:
        super().__init__()
        if self._initialize_built_once:
            self._initialize_left = self._initialize_rules_to_run
            self._initialize_rules_to_run = []

    @property
    def _rules_strategy(self) -> SearchStrategy:
        left = self.__dict__.get("_initialize_left")
        if not left:
            return self._every_rule_strategy
        built = type(self).__dict__.get("_initialize_strategies")
        if built is None:  # the class's own, forgotten with it (machines are made per search)
            built = {}
            setattr(type(self), "_initialize_strategies", built)
        key = tuple(left)
        if key not in built:
            built[key] = _as_hypothesis_builds(key)
        return _InitializeStep(self, built[key])

    @_rules_strategy.setter
    def _rules_strategy(self, strategy: SearchStrategy) -> None:
        self._every_rule_strategy = strategy

    def check_invariants(self, *arguments: Any) -> None:
        """Hypothesis's, seeing the initialize rules left where it looks for them: an invariant
        not marked ``check_during_init`` is skipped until none is left."""
        if not self.__dict__.get("_initialize_left"):
            return super().check_invariants(*arguments)
        self._initialize_rules_to_run = self._initialize_left
        try:
            return super().check_invariants(*arguments)
        finally:
            self._initialize_rules_to_run = []
