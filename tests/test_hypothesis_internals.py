"""What the certifier relies on in Hypothesis beyond its documented API, one test each.

pyproject.toml pins Hypothesis to the range these pass on.  If one fails after an upgrade, its
message names the behaviour that changed and the code that relies on it: fix that code, or keep
the pin below the new version.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.control import current_build_context
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, initialize, invariant, multiple, rule, run_state_machine_as_test,
)

from harel_ref.certify._driver import StopSearch, shrunk_steps

from harel_ref.certify._faults import _raising_step
from harel_ref.stateful._initialize import InitializeRulesBuiltOnce


class FailsOnTheThirdPoke(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pokes = 0

    @rule(amount=st.integers(1, 3))
    def publish(self, amount):  # a name of the machine's rules: _raising_step looks for those
        self.pokes += 1
        if self.pokes == 3:
            raise RuntimeError("third poke")


def failing_machine_error() -> BaseException:
    with pytest.raises(RuntimeError) as caught:
        run_state_machine_as_test(
            FailsOnTheThirdPoke,
            settings=settings(max_examples=50, derandomize=True, database=None, deadline=None),
        )
    return caught.value


def test_shrunk_steps_are_attached_as_notes():
    steps = shrunk_steps(failing_machine_error())
    assert steps[:1] == ["state = FailsOnTheThirdPoke()"] and steps[-1:] == ["state.teardown()"], (
        "Hypothesis no longer attaches a failing state machine's steps to the exception as "
        "__notes__ lines from 'state = Machine()' to 'state.teardown()'; "
        f"harel_ref.certify._driver.shrunk_steps relies on it to show a failure's steps (got {steps})"
    )
    assert sum(line.startswith("state.publish(") for line in steps) == 3, steps


def test_a_rule_runs_in_a_frame_named_after_it():
    step = _raising_step(failing_machine_error())
    assert step == "state.publish(...)", (
        "a rule no longer runs in a frame named after the rule with 'self' in its locals; "
        "harel_ref.certify._faults._raising_step relies on it to name the step that raised "
        f"(got {step!r})"
    )


def test_an_interrupt_subclass_stops_a_search_at_once_and_passes_through():
    """A spent time budget or a broken transport stops a search by raising ``StopSearch``, a
    KeyboardInterrupt: Hypothesis must let it through unchanged, not shrink it, retry it or
    report it as a failure."""
    ran = []

    @settings(max_examples=100, derandomize=True, database=None, deadline=None)
    @given(st.integers())
    def search(value):
        ran.append(value)
        if len(ran) == 3:
            raise StopSearch()

    with pytest.raises(BaseException) as caught:
        search()
    assert type(caught.value) is StopSearch and len(ran) == 3, (
        "Hypothesis no longer passes a KeyboardInterrupt subclass raised inside a test through "
        "unchanged and at once; harel_ref.certify._driver.StopSearch relies on it to stop a "
        f"search when the time budget is spent or the transport broke (got {type(caught.value).__name__} after "
        f"{len(ran)} examples)"
    )


def test_hypothesis_takes_local_constants_from_a_function_the_certifier_replaces(monkeypatch):
    """harel_ref.certify._driver.hypothesis_apart replaces
    ``hypothesis.internal.conjecture.providers._get_local_constants`` while a search runs, so
    that a seed finds the same examples in any process: Hypothesis must still call it."""
    from hypothesis.internal.conjecture import providers

    calls = []
    real = providers._get_local_constants
    monkeypatch.setattr(providers, "_get_local_constants", lambda: calls.append(1) or real())

    @settings(max_examples=300, database=None)
    @given(st.integers())
    def draws(number):
        pass

    draws()
    assert calls, (
        "Hypothesis no longer calls providers._get_local_constants to find the literals of local "
        "modules; harel_ref.certify._driver.hypothesis_apart replaces it to keep them out of searches"
    )


def test_while_a_search_runs_hypothesis_has_no_local_constants_and_a_home_of_its_own(tmp_path):
    from hypothesis import configuration
    from hypothesis.internal.conjecture import providers

    from harel_ref.certify._driver import hypothesis_apart

    home = configuration.storage_directory(intent_to_write=False).home_directory
    with hypothesis_apart(str(tmp_path / "home")):
        assert len(providers._get_local_constants()) == 0
        assert configuration.storage_directory(intent_to_write=False).home_directory == tmp_path / "home"
    assert configuration.storage_directory(intent_to_write=False).home_directory == home
    assert len(providers._get_local_constants()) > 0  # this project's modules are local


def test_hypothesis_keeps_each_machine_class_it_ran_where_the_certifier_forgets_it(tmp_path):
    """Hypothesis keeps every state machine class it ran (``_setup_state_per_class``) and the
    last 128 in ``RuleStrategy._setup_for``'s cache; hypothesis_apart removes what a search
    added there, and only that."""
    from hypothesis.stateful import RuleStrategy

    from harel_ref.certify._driver import hypothesis_apart

    kept = RuleBasedStateMachine._setup_state_per_class

    class Earlier(FailsOnTheThirdPoke):
        pass

    Earlier.setup_state()
    with hypothesis_apart(str(tmp_path / "home")):
        class Searched(FailsOnTheThirdPoke):
            pass

        with pytest.raises(RuntimeError):
            run_state_machine_as_test(Searched, settings=settings(database=None, max_examples=20))
        assert Searched in kept and RuleStrategy._setup_for.cache_info().currsize > 0  # what Hypothesis does
    assert Searched not in kept and Earlier in kept and RuleStrategy._setup_for.cache_info().currsize == 0


def test_hypothesis_digests_a_searched_machine_by_its_name_without_parsing_a_module(tmp_path, monkeypatch):
    """At each search Hypothesis digests the machine (``function_digest``): ``inspect.getsource``
    parsed the whole module the class named (7-30 ms), only to find no such class, since the
    certifier makes it, and fall back to its name.  The searched class names a module with no
    file: no parse, and the digest of a class of that name that Hypothesis cannot find."""
    import ast
    import tempfile

    from hypothesis.internal.reflection import function_digest

    from harel_ref.certify._driver import watched_machine
    from harel_ref.stateful import make_machine
    from harel_ref.stateful.backends import load

    machine = make_machine(load("memory")(tempfile.mkdtemp(dir=tmp_path)))
    searched = watched_machine(machine, None)
    nowhere = type(machine.__name__, (machine,), {"__module__": "harel_ref.stateful._machine"})  # not found there
    parsed = []
    monkeypatch.setattr(ast, "parse", lambda *args, **kwargs: parsed.append(args) or pytest.fail("parsed"))
    assert function_digest(searched) != b"" and not parsed
    monkeypatch.undo()
    assert function_digest(searched) == function_digest(nowhere)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_certification_leaves_nothing_in_the_current_or_temporary_directory(tmp_path, jobs):
    import os
    import subprocess
    import sys

    work, scratch = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    scratch.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "harel_ref._cli", "certify", "--bundled", "sqlite", "--profile", "quick/5",
         "--only", "fifo", "--only", "contention", "--jobs", jobs, "--report-dir", "reports", "--quiet"],
        cwd=work, env={**os.environ, "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert sorted(p.name for p in work.iterdir()) == ["reports"]  # no .hypothesis
    assert list(scratch.iterdir()) == []


def test_the_machines_characters_are_those_of_the_utf8_codec():
    """The lockstep machine draws event text from ``characters(exclude_categories=["Cs"])``
    rather than Hypothesis's default ``characters(codec="utf-8")``: the same characters (so the
    same examples), without the table of the codec, which each search process would build again
    (1.8 s) because its Hypothesis caches live in a scratch directory (SPEC.md C1)."""
    from harel_ref.stateful._machine import UTF8

    def intervals(strategy):
        strategy.validate()
        while hasattr(strategy, "wrapped_strategy"):
            strategy = strategy.wrapped_strategy
        return strategy.intervals

    ours, codec = intervals(UTF8), intervals(st.characters(codec="utf-8"))
    assert ours == codec, (
        "characters(exclude_categories=['Cs']) no longer draws from the same characters as "
        "characters(codec='utf-8'); harel_ref.stateful._machine.UTF8 relies on it to keep the "
        f"examples of a seed (got {ours.intervals[:4]}... against {codec.intervals[:4]}...)"
    )


class OverrunsThenRejectsAtTeardown(RuleBasedStateMachine):
    """Every example draws more than Hypothesis's buffer holds, so it ends by running out of
    data; its teardown then rejects, as a search that sets an example aside does (_reject)."""

    seen: list[bool] = []

    @rule(text=st.binary(min_size=4096, max_size=4096))
    def publish(self, text):
        pass

    def teardown(self):
        from harel_ref.certify._driver import _Discarded, _reject

        from hypothesis.control import current_build_context
        self.seen.append(current_build_context().data.frozen)
        try:
            _reject()
        except _Discarded:
            pass


def test_an_example_that_ran_out_of_data_is_frozen_at_its_teardown():
    """_reject reads ``current_build_context().data.frozen``: an example that ran out of data is
    frozen by its teardown, where Hypothesis's reject would end the search with ``Frozen``."""
    from hypothesis.errors import Unsatisfiable

    OverrunsThenRejectsAtTeardown.seen = []
    with pytest.raises(Unsatisfiable):  # no example could be run whole: nothing else escaped
        run_state_machine_as_test(OverrunsThenRejectsAtTeardown, settings=settings(
            max_examples=5, derandomize=True, database=None, deadline=None, stateful_step_count=50,
            suppress_health_check=list(HealthCheck)))
    assert True in OverrunsThenRejectsAtTeardown.seen, OverrunsThenRejectsAtTeardown.seen


class InvalidThenFailsAtTeardown(RuleBasedStateMachine):
    """Every example is made invalid by its third step (as a refused draw makes it), and its
    teardown then fails: the choices of the first such example are kept."""

    choices: list[tuple] = []

    def __init__(self):
        super().__init__()
        self.pokes = 0

    @rule(amount=st.integers(1, 3))
    def publish(self, amount):
        self.pokes += 1
        if self.pokes == 3:
            current_build_context().data.mark_invalid("refused")

    def teardown(self):
        if self.pokes >= 3:
            self.choices.append(tuple(current_build_context().data.choices))
            raise AssertionError("met at teardown")


def test_a_failure_at_the_teardown_of_an_invalid_example_is_seen_again_from_its_choices():
    """harel_ref.certify._driver.unseen_failure relies on both: Hypothesis discards what the
    teardown of an example already invalid raised, and ``reproduce_failure`` of that example's
    choices raises it, printing the steps from ``state = ...`` to ``state.teardown()``."""
    from harel_ref.certify._choices import run_choices

    InvalidThenFailsAtTeardown.choices = []
    run_state_machine_as_test(InvalidThenFailsAtTeardown, settings=settings(
        max_examples=10, derandomize=True, database=None, deadline=None, stateful_step_count=10,
        suppress_health_check=list(HealthCheck)))  # no failure: every one was discarded
    assert InvalidThenFailsAtTeardown.choices, "no example reached its third step"
    printed: list[str] = []
    again = run_choices(InvalidThenFailsAtTeardown, InvalidThenFailsAtTeardown.choices[0], 10, printed)
    steps = shrunk_steps(type("Noted", (Exception,), {"__notes__": printed})())
    assert isinstance(again, AssertionError) and str(again) == "met at teardown", (
        "reproduce_failure of the choices of an example made invalid before its teardown failed no "
        "longer raises what the teardown raised; harel_ref.certify._driver.unseen_failure relies on "
        f"it to show such a failure with its steps (got {again!r})")
    assert steps[0] == "state = InvalidThenFailsAtTeardown()" and steps[-1] == "state.teardown()", steps
    assert sum(step.startswith("state.publish(") for step in steps) == 3, steps


def _initialize_alike(offset: int):
    """An initialize rule whose function has the same name as every other this makes."""

    @initialize(extra=st.integers(0, 2))
    def set_up(self, extra):
        self.offsets.append(offset + extra)

    return set_up


class ThreeInitializeRules(InitializeRulesBuiltOnce, RuleBasedStateMachine):
    """Initialize rules with bundles and arguments, as TransportMachine's (and two whose
    functions share a name), an invariant that needs them all run, and a bug that needs two of
    their values: every example's choices are recorded at its teardown."""

    seen: list = []
    things = Bundle("things")
    names = Bundle("names")
    first_alike = _initialize_alike(0)
    second_alike = _initialize_alike(10)

    def __init__(self):
        super().__init__()
        self.offsets = []

    @invariant()
    def every_initialize_rule_ran(self):
        assert len(self.offsets) == 2 and hasattr(self, "extra"), "an invariant ran before the initialize rules"

    @initialize(target=things, values=st.lists(st.integers(0, 9), min_size=1, max_size=3))
    def begin(self, values):
        self.values = list(values)
        return multiple(*values)

    @initialize(target=names, name=st.sampled_from(["a", "b", "c"]))
    def choose_name(self, name):
        return name

    @initialize(extra=st.text(max_size=3))
    def prefill(self, extra):
        self.extra = extra

    @rule(thing=things, name=names, more=st.integers(0, 5))
    def use(self, thing, name, more):
        if thing + more >= 9 and name == "b":
            raise AssertionError("the bug")

    def teardown(self):
        self.seen.append(tuple(current_build_context().data.choices))


def _choices_and_steps(built_once: bool) -> tuple[list, list[str]]:
    machine = type("Machine", (ThreeInitializeRules,), {"_initialize_built_once": built_once, "seen": []})
    with pytest.raises(AssertionError) as caught:
        run_state_machine_as_test(machine, settings=settings(max_examples=40, stateful_step_count=6, derandomize=True, database=None,
                                                             deadline=None))
    return machine.seen, shrunk_steps(caught.value)


def test_initialize_rules_built_once_draw_as_hypothesis_draws_them():
    """stateful/_initialize.py hands Hypothesis the strategy of an initialize step built once;
    it relies on ``_initialize_rules_to_run`` and ``_rules_strategy`` as RuleBasedStateMachine
    uses them.  Both ways, every example (searched and shrunk) draws the same choices, the
    invariant waits for the initialize rules, and the failure shrinks to the same steps."""
    ours, our_steps = _choices_and_steps(True)
    theirs, their_steps = _choices_and_steps(False)
    assert len(ours) > 40 and ours == theirs and our_steps == their_steps, (
        "a machine's initialize steps drawn from the strategies stateful/_initialize.py builds "
        "once no longer draw what RuleBasedStateMachine draws (it relies on its "
        "_initialize_rules_to_run and _rules_strategy): make InitializeRulesBuiltOnce follow "
        f"the change, or drop it (examples {len(ours)} and {len(theirs)}; steps {our_steps} and {their_steps})"
    )
    assert sum(step.startswith("state.use(") for step in our_steps) == 1, our_steps
    assert sum(".set_up(" in step for step in our_steps) == 2, our_steps


def _drawn_on_a_new_thread(before=lambda: None) -> tuple[list, int]:
    """The values a seeded test draws, run on a thread of its own (``before`` first), and how
    often Hypothesis registered a Random meanwhile."""
    import threading

    from hypothesis import seed
    from hypothesis.internal import entropy

    drawn, registered = [], []
    real = entropy.register_random

    @seed(7)
    @settings(max_examples=20, database=None, deadline=None)
    @given(st.lists(st.integers(0, 9), max_size=4))
    def test(values):
        drawn.append(values)

    def run():
        before()
        test()

    entropy.register_random = lambda r: (registered.append(r), real(r))[1]
    try:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    finally:
        entropy.register_random = real
    return drawn, len(registered)


def test_a_search_thread_is_given_hypothesis_random_so_no_collection_runs():
    """harel_ref.certify._driver.no_collection_per_thread: Hypothesis makes and registers a
    Random (a full garbage collection, then gc.get_referrers) at the first example of every
    thread; set beforehand, it does neither, and a seeded test draws the same values."""
    from harel_ref.certify._driver import no_collection_per_thread

    as_hypothesis_does, registered = _drawn_on_a_new_thread()
    assert registered == 1, "Hypothesis no longer registers a Random per thread: no_collection_per_thread is moot"
    given_beforehand, registered = _drawn_on_a_new_thread(no_collection_per_thread)
    assert registered == 0, "hypothesis.core.threadlocal._hypothesis_global_random is no longer what Hypothesis reads"
    assert given_beforehand == as_hypothesis_does
