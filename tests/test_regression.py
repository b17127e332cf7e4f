"""A failure's regression test in the transport's own calls (issue 44): it fails against the
bug and passes once the bug is fixed, and holds nothing of harel-ref.

Each broken variant's test is run twice: against the variant, and against the transport it
was made from (its fixed self).  The generated module's factory line is swapped for the one
under test, which is what a user does by fixing their own module.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from broken import BROKEN, OF_VALUES, ONE_BUG_MANY_SEARCHES, WIDE, broken_backend, importable_factory

from harel_ref import check_at_once
from harel_ref.certify import Profile, certify
from harel_ref.stateful.backends import load
from harel_ref.transport import InMemoryStore, InMemoryTransport
from harel_ref.transport.memory import InMemoryCore

VARIANTS = {**BROKEN, **OF_VALUES, **ONE_BUG_MANY_SEARCHES}
SMALL = Profile("small", max_examples=25, step_count=15)

SAMPLE = [
    "unfenced ack",  # an ack's answer
    "parked group claimable early",  # a claim's outcome
    "a forged lease is accepted",  # bad input: a forged lease, copied from a real one
    "the clock is not checked",  # bad input: the clock answers NaN
    "closed without saying so",  # calls after close
    "group ids fold case",  # the drain, near-colliding ids
    "routing keys read twice",  # an iterator argument
    "one close closes every instance",  # a call on an instance still open, after another's close
]
"""Variants whose failures show each kind of call the test writes; benchmarks/regression_tests.py
runs every variant."""


def run_test(code: str, factory) -> BaseException | None:
    """Run the test function of the module ``code`` with ``factory`` as its factory; what it
    raised, or None."""
    lines = code.splitlines()
    start = lines.index("# The transport under test: the factory certified.") + 1
    end = next(n for n in range(start, len(lines)) if lines[n].startswith(("class Clock", "# A claim's lease")))
    namespace = {"__name__": "regression", "given_factory": factory}
    exec(compile("\n".join([*lines[:start], "factory = given_factory", *lines[end:]]), "<regression>", "exec"),
         namespace)  # noqa: S102 - the test harel-ref wrote
    [test] = [value for name, value in namespace.items() if name.startswith("test_")]
    try:
        test()
    except (AssertionError, pytest.fail.Exception) as failed:
        return failed
    return None


@pytest.mark.parametrize("name", SAMPLE)
def test_a_variants_regression_test_fails_on_it_and_passes_on_the_transport_it_came_from(name):
    _, prop = VARIANTS[name]
    backend = broken_backend(name)
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=[prop])
    failure = report.verdict(prop).failure
    assert failure is not None and failure.regression, (failure and failure.no_regression, report.to_markdown())
    assert not re.search(r"harel_ref\.(stateful|certify)", failure.regression)
    failed = run_test(failure.regression, backend.factory)
    assert failed is not None, failure.regression
    # the model's reason: the step, and what the specification allows there (judged strictly,
    # every property's fine print, so it may allow less than the focused search did)
    assert failure.step[:12] in str(failed) and "the specification allows" in str(failed), (str(failed), failure)
    assert run_test(failure.regression, load("memory")(None).factory) is None, failure.regression


def async_of(cls: type):
    """An async factory of the variant ``cls``: its calls behind coroutines, as an asyncio
    transport makes them (the in-memory twin, with the variant inside)."""
    from harel_ref.stateful.backends.memory import AsyncInMemoryTransport
    from harel_ref.transport import InMemoryStore

    stores = {}

    async def factory(clock, namespace):
        made = AsyncInMemoryTransport(clock, stores.setdefault(namespace, InMemoryStore()))
        made._sync = cls(clock=clock, store=made._sync.store)
        return made

    return factory


def test_an_async_transports_regression_test_awaits_its_calls():
    cls, prop = VARIANTS["parked group claimable early"]
    caps = load("memory-async")(None).capabilities
    report = certify(async_of(cls), caps, profile="quick", properties=[prop], is_async=True)
    code = report.verdict(prop).failure.regression
    assert "asyncio.run(" in code and "await q0.claim(" in code and "made = await made" in code, code
    assert run_test(code, async_of(cls)) is not None
    assert run_test(code, async_of(InMemoryTransport)) is None, code
    # a factory whose result is awaitable but no coroutine (a driver's connect(), a Future)
    assert run_test(code, awaitable(async_of(cls))) is not None
    assert run_test(code, awaitable(async_of(InMemoryTransport))) is None, code


class _Awaitable:
    """An awaitable that is not a coroutine, around one."""

    def __init__(self, coroutine) -> None:
        self.coroutine = coroutine

    def __await__(self):
        return self.coroutine.__await__()


def awaitable(factory):
    """``factory`` (async) as a plain function that returns an awaitable, not a coroutine."""
    return lambda clock, namespace: _Awaitable(factory(clock, namespace))


QUEUE = '''
from harel_ref.transport import InMemoryStore, InMemoryTransport

STORES = {}
FLOOR_IGNORED = %s  # the bug: a claim takes any group, whatever its priority


class Queue(InMemoryTransport):
    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        if FLOOR_IGNORED and min_priority in (1, 2, 3, 4):
            min_priority = 0
        return super().claim(worker_id, visibility, min_priority, routing_keys)


def factory(clock, namespace):
    return Queue(clock=clock, store=STORES.setdefault(namespace, InMemoryStore()))
'''


def test_the_written_test_fails_in_the_users_suite_until_the_bug_is_fixed(tmp_path):
    """As a user runs it: certify, --write-tests, pytest on what was written (it fails), fix
    the module, pytest again (it passes)."""
    (tmp_path / "queue_under_test.py").write_text(QUEUE % "True")
    certified = subprocess.run(
        [str(Path(sys.executable).parent / "harel-ref"), "certify", "queue_under_test:factory", "--only", "priority-floor",
         "--profile", "quick", "--quiet", "--report-dir", "reports", "--write-tests", "regression"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert certified.returncode == 1 and "regression tests: regression/test_priority_floor.py" in certified.stdout, \
        certified.stdout + certified.stderr
    written = (tmp_path / "regression" / "test_priority_floor.py").read_text()
    assert "from queue_under_test import factory" in written and "harel_ref" not in written
    assert "```python" in (tmp_path / "reports" / "REPORT.md").read_text()

    def pytest_run():
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "regression"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)

    today = pytest_run()
    assert today.returncode == 1 and "min_priority" in today.stdout, today.stdout
    (tmp_path / "queue_under_test.py").write_text(QUEUE % "False")
    fixed = pytest_run()
    assert fixed.returncode == 0, fixed.stdout + textwrap.indent(written, "    ")


def factory_of(cls: type, *, namespaced: bool = True):
    """A factory of the in-memory variant ``cls``: one store per namespace, or (``namespaced``
    False) harel.testing's ``make(clock)``, a fresh store each call."""
    from harel_ref.transport import InMemoryStore

    stores = {}
    if not namespaced:
        return lambda clock: cls(clock=clock, store=InMemoryStore())
    return lambda clock, namespace: cls(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))


class PublishAnswers(InMemoryTransport):
    """A publish that answers True (R1: it answers None)."""

    def publish(self, *args, **kwargs):
        super().publish(*args, **kwargs)
        return True


class CountedTokens(InMemoryTransport):
    """Tokens from a counter per opened transport, as ``worker:N``: a second instance, or a
    reopened one, hands out ``w1:1`` again (R16)."""

    class Core(InMemoryCore):
        count = 0

        def claim(self, token, *args):
            self.count += 1
            return super().claim(f"{token.split(':')[0]}:{self.count}", *args)


@pytest.mark.parametrize("bug, prop, kind", [(PublishAnswers, "no-loss", "publish-answered"),
                                             (CountedTokens, "fencing", "token-reused")])
def test_the_call_that_diverged_asserts_what_it_broke_whatever_it_broke(bug, prop, kind):
    """A publish that answers, a token handed out twice: the written test asserts what each kind
    of divergence broke (a reviewer's find: a publish was written with no assertion, and a
    reused token's claim asserted only its group and event, so both tests passed on the broken
    transport)."""
    broken = factory_of(bug)
    report = certify(broken, load("memory")(None).capabilities, profile="quick", properties=[prop])
    failure = report.verdict(prop).failure
    assert failure.kind == kind and failure.regression, failure
    assert run_test(failure.regression, broken) is not None, failure.regression
    assert run_test(failure.regression, load("memory")(None).factory) is None, failure.regression


class RaisesOnNack(InMemoryTransport):
    """nack raises an ordinary error, as an unimplemented method or a driver's does."""

    def nack(self, lease, delay=0):
        raise RuntimeError("nack is not implemented")


def close_hangs_after_a_nack():
    """An asyncio in-memory transport whose close never returns once a nack was made through it:
    a hang at the teardown's close, outside any step, which only declares the transport broken."""
    import asyncio

    from harel_ref.stateful.backends.memory import AsyncInMemoryTransport

    class CloseHangsAfterANack(AsyncInMemoryTransport):
        async def nack(self, *args, **kwargs):
            self.nacked = True
            return await super().nack(*args, **kwargs)

        async def close(self):
            if getattr(self, "nacked", False):
                await asyncio.Event().wait()
            return await super().close()

    return factory_of(CloseHangsAfterANack)


@pytest.fixture
def hung_calls_released():
    """Calls that hang in this test end when it is over (their threads were abandoned)."""
    from broken import RELEASE_HUNG

    RELEASE_HUNG.clear()
    yield
    RELEASE_HUNG.set()


SAID = {"raises": "RuntimeError: nack is not implemented", "panics": "PanicException", "exits its thread": "SystemExit",
        "hangs": "nack did not return within 2.0 s", "hangs, asyncio": "nack did not return within 2.0 s",
        "its worker thread dies": "nack did not return within 2.0 s",
        "close hangs, asyncio": "close did not return within 2.0 s"}
"""What the written test's failure says, for each fault (tests/broken.py's FAULTS, and one that raises)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # _thread.exit()
@pytest.mark.parametrize("name", list(SAID))
def test_a_call_that_raises_panics_ends_its_thread_or_hangs_gets_a_test_that_it_returns(name, hung_calls_released):
    """A fault (SPEC.md C14).  A call that raised, panicked or ended its thread is made inside a
    ``try`` that catches any BaseException and fails saying what it raised.  A call that hung
    stopped its search unshrunk, without steps: its example is replayed from Hypothesis's
    choices, and the call is made on a thread (a task) the test leaves to it after the call
    deadline.  Either way the test fails on the variant with the model's reason, and passes on
    the transport the variant came from, whose call returns."""
    from broken import fault_backend

    if name == "raises":
        broken, fixed, caps, is_async = factory_of(RaisesOnNack), factory_of(InMemoryTransport), None, False
    elif name == "close hangs, asyncio":  # its example's choices are kept as the next one starts
        broken, caps, is_async = close_hangs_after_a_nack(), None, True
        fixed = load("memory-async")(None).factory
    else:
        backend = fault_backend(name)
        broken, caps, is_async = backend.factory, backend.capabilities, backend.is_async
        fixed = load("memory-async" if is_async else "memory")(None).factory
    report = certify(broken, caps or load("memory")(None).capabilities, profile=SMALL, properties=["fifo"],
                     is_async=is_async, call_deadline=2.0)
    failure = report.verdict("fifo").failure
    assert failure.regression, (failure.no_regression, report.to_markdown())
    failed = run_test(failure.regression, broken)
    assert failed is not None and SAID[name] in str(failed), (failed, failure.regression)
    assert "the specification allows" in str(failed), str(failed)
    assert run_test(failure.regression, fixed) is None, failure.regression


def test_a_stale_release_that_raised_must_answer_what_the_specification_gives_not_only_return():
    """A stale ack that raises (R10: it answers False): the written test fails on it, passes on
    the reference, and fails on a store whose stale ack answers True instead of raising, which
    is as wrong (a reviewer's find: written as a call that must merely return, it passed there)."""
    cls, prop = VARIANTS["a stale ack or nack raises"]
    report = certify(factory_of(cls), load("memory")(None).capabilities, profile="quick", properties=[prop])
    code = report.verdict(prop).failure.regression
    assert run_test(code, factory_of(cls)) is not None, code
    assert run_test(code, factory_of(InMemoryTransport)) is None, code
    assert run_test(code, factory_of(AnswersTrueWhateverItAcks)) is not None, code


class AnswersTrueWhateverItAcks(InMemoryTransport):
    """ack answers True, whether or not its lease held anything (R10: a stale one answers False)."""

    def ack(self, lease):
        super().ack(lease)
        return True


def test_a_factory_of_clock_alone_is_called_as_the_certifier_called_it():
    """harel.testing's ``make(clock)``: the test calls it with the clock alone (a reviewer's find:
    it called ``factory(clock, namespace)`` and raised TypeError on either transport)."""
    from harel_ref.stateful import Capabilities

    cls, prop = VARIANTS["unfenced ack"]
    report = certify(factory_of(cls, namespaced=False), Capabilities(), profile="quick", properties=[prop])
    code = report.verdict(prop).failure.regression
    assert "made = factory(clock)" in code and "namespace" not in code.split("def test_")[1], code
    assert run_test(code, factory_of(cls, namespaced=False)) is not None
    assert run_test(code, factory_of(InMemoryTransport, namespaced=False)) is None


def test_steps_printed_over_several_lines_are_one_statement():
    """Hypothesis prints a step with long arguments over several lines: replayed line by line
    it raised SyntaxError, so such a failure got no test (and C7's taking away of steps never
    ran on it)."""
    from harel_ref.certify._driver import _statements

    lines = ["state = M()", "state.begin(group_ids=['job',", "    'Job'], clock=1000.0)", "state.teardown()"]
    assert _statements(lines) == ["state = M()", "state.begin(group_ids=['job',\n    'Job'], clock=1000.0)",
                                  "state.teardown()"]
    _, prop = VARIANTS["group ids cut at 255 characters"]
    backend = broken_backend("group ids cut at 255 characters")
    # a seed whose quick search finds it (of seeds 0-5, 3 and 5, once ids of equal hashes were a
    # family too, and so the long ids drawn less often)
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=[prop], seed=3)
    failure = report.verdict(prop).failure
    assert failure.regression and any("\n" in step for step in failure.steps), (failure.no_regression, failure.steps)
    assert run_test(failure.regression, backend.factory) is not None
    assert run_test(failure.regression, load("memory")(None).factory) is None


# --- A race's regression test: the program, run at once, and the checker's verdict ----------


@pytest.mark.parametrize("name", WIDE)
def test_a_races_regression_test_fails_on_the_variant_and_passes_on_the_transport_it_came_from(name):
    """A WIDE variant breaks only when four callers are in progress at once: its failure is
    the concurrent search's, judged for refusals (a server that takes 3 connections) or for
    histories (claims marked in 3 slots), and its test asserts the checker's verdict."""
    _, prop = WIDE[name]
    backend = broken_backend(name)
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=[prop])
    failure = report.verdict(prop).failure
    assert failure is not None and failure.found_by == "concurrent", report.to_markdown()
    code = failure.regression
    assert code and "check_at_once(factory, PREFIX, BRANCHES" in code, (failure.no_regression, code)
    assert not re.search(r"harel_ref\.(stateful|certify)", code)
    assert "of those runs showed the race" in " ".join(code.split()), code  # as often as the search saw it
    failed = run_test(code, importable_factory(name))  # runs enough to show it at the rate measured
    assert failed is not None and failure.fact.expected in str(failed), (code, failed)
    assert run_test(code, load("memory")(None).factory) is None, code


@pytest.mark.parametrize("refused, made, runs", [
    (5, 5, 15),  # every run showed it: made * (1000 ** (1/5) - 1)
    (5, 40, 120),  # one in eight
    (5, 165, 492),  # one in 33, as "ack drops its emptied group apart" showed in threads
    (1, 300, 3000),  # once in 300: more than the test can afford, at most MOST_RUNS
    (0, 30, 3000),  # never again: the most
])
def test_a_races_test_makes_runs_enough_to_show_it_at_the_rate_the_search_measured(refused, made, runs):
    """A race that came out of shrinking shows at the rate the search measured afresh: the test
    makes runs enough to miss it about once in a thousand (the NARROW races' tests of 20 runs
    passed on their variants; the search had run thousands).  The runs are counted until five
    showed it, so the rate they give is too high: the runs are set from the rates they leave
    likely, and in a simulation of that counting the tests missed at most once in a thousand."""
    import random
    from harel_ref.certify._regression_race import runs_to_show

    assert runs_to_show(refused, made) == runs
    generator, missed = random.Random(1), []
    for rate in (0.1, 0.01):  # measured as failing_runs measures: until five showed it, 300 runs at most
        for _ in range(2000):
            shown = counted = 0
            while counted < 300 and shown < 5:
                counted, shown = counted + 1, shown + (generator.random() < rate)
            missed.append((1 - rate) ** runs_to_show(shown, counted))
    assert sum(missed) / len(missed) < 1.5 / 1000, sum(missed) / len(missed)


def test_how_often_a_race_shows_is_counted_over_fresh_runs_and_stops_when_enough_did():
    """``failing_runs`` counts every refused run, not the first, and stops once enough were: on
    a store whose claims find nothing, every run of a published message and two claims is
    refused; on the reference, none."""
    import time

    from harel_ref.stateful import Capabilities
    from harel_ref.stateful.parallel import Claim, Program, Publish, failing_runs
    from harel_ref.transport import InMemoryTransport

    class ClaimsNothing(InMemoryTransport):
        def claim(self, *args, **kwargs):
            return None

    program = Program(prefix=(Publish("g1", "e1"),), branches=((Claim(),), (Claim(),)))
    caps = Capabilities(durable=False, shared=False)
    broken = lambda clock, namespace: ClaimsNothing(clock=clock)  # noqa: E731
    assert failing_runs(broken, program, caps, runs=200, enough=4, until=time.monotonic() + 600) == (4, 4)
    memory = load("memory")(None)
    assert failing_runs(memory.factory, program, memory.capabilities, runs=30, enough=3,
                        until=time.monotonic() + 600) == (0, 30)


def test_check_at_once_refuses_a_call_it_does_not_make_and_says_which():
    memory = load("memory")(None).factory
    for calls, said in [([("frob",)], "'frob' is no call check_at_once makes"),
                        ([("claim", "w1")], "wrong arguments for claim"),
                        (["claim"], "a call is a tuple that starts with the method's name"),
                        ([("lapse", "later")], "lapse takes nothing, or 'exact'"),
                        ([("ack", "p3")], "names no claim made before it"),
                        ([("publish", 1, "e")], "wrong arguments for publish"),
                        ([("publish", "g", "e"), ("claim",), ("nack", "p0", -1)], "a nack's delay is a number"),
                        ([("publish", "g", "e"), ("claim",), ("nack", "p0", "soon")], "a nack's delay is a number")]:
        with pytest.raises(ValueError, match=re.escape(said)):
            check_at_once(memory, calls, [[("claim",)], [("claim",)]])
    for options, said in [({"runs": 0}, "runs must be a whole number >= 1"),
                          ({"refusals": False, "histories": False}, "judge something"),
                          ({"capabilities": {"frob": True}}, "no such capabilities: ['frob']"),
                          ({"capabilities": {"fairness": "sometimes"}}, "Capabilities.fairness must be one of")]:
        with pytest.raises(ValueError, match=re.escape(said)):
            check_at_once(memory, [], [[("claim",)], [("claim",)]], **options)
    assert check_at_once(memory, [("publish", "g", "e"), ("claim",)], [[("ack", "p0")], [("claim",)]], runs=3) is None


# --- A transport of harel's Protocol: harel's calls and Events --------------------------------


class InHarelsProtocol:
    """harel-ref's in-memory reference speaking harel's Protocol (events are harel Events, a
    lease is harel's, ack and nack answer None): the fixed self that a test written for one of
    harel's transports must pass on."""

    events: dict[str, object] = {}  # an Event by its id: the reference keeps event texts

    def __init__(self, clock, store) -> None:
        self.reference = InMemoryTransport(clock, store)

    def publish(self, group_id, event, priority=0):
        self.events[event.id] = event
        self.reference.publish(group_id, event.id, priority)

    def claim(self, worker_id, visibility, min_priority=0):
        from harel.engine.transport import Lease as HarelLease

        lease = self.reference.claim(worker_id, visibility, min_priority)
        return None if lease is None else HarelLease(seq=lease.seq, group_id=lease.group_id,
                                                     event=self.events[lease.event], token=lease.token)

    def ack(self, lease):
        self.reference.ack(self._ours(lease))

    def nack(self, lease, delay=0):
        self.reference.nack(self._ours(lease), delay)

    def close(self):
        self.reference.close()

    @staticmethod
    def _ours(lease):
        from harel_ref import Lease

        return Lease(group_id=lease.group_id, event=lease.event.id, seq=lease.seq, token=lease.token)


@pytest.mark.parametrize("prop", ["tie-break", "close"])
def test_a_harel_transports_regression_test_makes_harels_calls(prop):
    """harel 0.9.0's InMemoryTransport breaks R4's tie-break and keeps working after close:
    each test publishes harel Events and claims through harel's Protocol, fails on it, and
    passes on the reference speaking that Protocol."""
    backend = load("harel-memory")(None)
    report = certify(backend.factory, backend.capabilities, profile="quick", properties=[prop])
    code = report.verdict(prop).failure.regression
    assert code and "from harel.spec.states import Event" in code and "event(" in code, report.to_markdown()
    assert not re.search(r"q\d+\.(publish|claim)\([^\n]*routing", code), code  # harel's calls take none
    assert not re.search(r"harel_ref\.(stateful|certify)|from harel_ref", code)
    assert run_test(code, backend.factory) is not None, code
    stores: dict = {}
    assert run_test(code, lambda clock, namespace: InHarelsProtocol(
        clock, stores.setdefault(namespace, InMemoryStore()))) is None, code


def test_a_races_test_compiles_whatever_its_failure_says_and_none_is_written_for_processes():
    """What the transport answered and the replay command go into the test's docstring: a NUL,
    a backslash, three quotes or a line separator there must not stop it compiling, and the
    command must stay whole."""
    from harel_ref.certify._regression_race import race_regression
    from harel_ref.certify._target import Target
    from harel_ref.stateful._facts import RAISED_UNDER_CONTENTION, Fact
    from harel_ref.stateful.parallel import Claim, Program

    target = Target.from_factory(importable_factory("a server that takes 3 connections"), None, False)
    program = Program(prefix=(), branches=((Claim(),), (Claim(),)))
    fact = Fact(RAISED_UNDER_CONTENTION, "b0: claim", "an answer", 'OSError("a\x00b \\N{x} """ \u2028")')
    replay = r"harel-ref certify mine:factory --group-ids 'g\d+' --profile standard --only contention"
    code, why = race_regression(target, program, fact, "contention", refusals=True, runs=3, ran_as="threads",
                                replay=replay)
    assert not why
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an invalid escape would warn
        exec(compile(code.replace("import pytest", "import pytest\nfactory = 1  #"), "<race>", "exec"), namespace)
    assert replay in namespace["__doc__"] and "a\\x00b \\N{x} '''" in namespace["__doc__"]
    code, why = race_regression(target, program, fact, "contention", refusals=True, runs=3, ran_as="processes")
    assert not why and f"processes={target.recipe.spec!r})" in code and "each on a process of its own" in " ".join(code.split())
    unnamed = Target.from_factory(lambda clock, namespace: None, None, False)
    code, why = race_regression(unnamed, program, fact, "contention", refusals=True, runs=3, ran_as="processes")
    assert not code and "branches in processes" in why and "import by name" in why


@pytest.mark.waits
def test_a_race_only_processes_show_gets_a_test_that_runs_its_branches_in_processes(tmp_path, monkeypatch):
    """A race the concurrent search saw with its branches in processes (claims kept apart by a
    lock of their process, so no two in one process meet): its test runs them in processes too,
    where it fails on the variant and passes on the transport it came from.  Run in threads, the
    same test passes on the variant: why a race seen so gets a test that runs so."""
    import broken
    from harel_ref.stateful import Capabilities

    monkeypatch.setenv("HAREL_BROKEN_DIR", str(tmp_path))  # the processes spawned inherit it
    variant, fixed = broken.claim_kept_apart_by_its_process, broken.sqlite_in_broken_dir
    report = certify(variant, Capabilities(durable=True, shared=True), profile="quick",
                     properties=["single-in-flight"], processes=True)
    failure = report.verdict("single-in-flight").failure
    assert failure is not None and failure.found_by == "concurrent", report.to_markdown()
    code = failure.regression
    named = "processes='broken:claim_kept_apart_by_its_process')"
    assert code and named in code and "from broken import claim_kept_apart_by_its_process" in code, \
        failure.no_regression
    assert not re.search(r"harel_ref\.(stateful|certify)", code)
    failed = run_test(code, variant)
    assert failed is not None and failure.fact.expected in str(failed), (code, failed)
    assert run_test(code.replace(named, "processes='broken:sqlite_in_broken_dir')"), fixed) is None
    assert run_test(code.replace(named, "processes=True)"), fixed) is None  # the factory's own name
    assert run_test(code.replace(", " + named, ")"), variant) is None  # on threads it never shows


def test_check_at_once_in_processes_refuses_a_factory_it_cannot_import_or_a_store_not_shared():
    memory = load("memory")(None).factory
    with pytest.raises(ValueError, match="import by name"):
        check_at_once(memory, [], [[("claim",)], [("claim",)]], processes=True, capabilities={"shared": True})
    import broken

    with pytest.raises(ValueError, match="shared=True"):
        check_at_once(broken.sqlite_in_broken_dir, [], [[("claim",)], [("claim",)]], processes=True)
    with pytest.raises(ValueError, match="module:attribute, got 'broken'"):
        check_at_once(broken.sqlite_in_broken_dir, [], [[("claim",)], [("claim",)]], processes="broken")
    shared = {"shared": True, "durable": True}
    with pytest.raises(ValueError, match="'broken:sqlite_in_broken_dri' cannot be imported here: AttributeError"):
        check_at_once(broken.sqlite_in_broken_dir, [], [[("claim",)], [("claim",)]], processes="broken:sqlite_in_broken_dri",
                      capabilities=shared)
    with pytest.raises(ValueError, match="is not the factory given"):
        check_at_once(broken.sqlite_in_broken_dir, [], [[("claim",)], [("claim",)]],
                      processes="broken:claim_kept_apart_by_its_process", capabilities=shared)
    in_memory = importable_factory("unfenced ack")  # a store of its own in each process
    with pytest.raises(ValueError, match="not shared across processes"):
        check_at_once(in_memory, [], [[("claim",)], [("claim",)]], processes=True, capabilities=shared)


def test_runs_of_like_calls_are_folded_into_loops_that_make_the_same_calls():
    """A probe's test is a thousand like calls (SPEC.md C14): runs of blocks that differ only
    in literals going up by a step, holding such a number, or coming round in a cycle are
    written as one loop, which makes the same calls with the same arguments in the same order.
    A literal that fits no expression of ``n`` leaves its run written out."""
    from harel_ref.certify._regression_loops import LEAST, folded

    workers = ["'w1'", "'W'", "'w\\u0301'"]
    blocks = [["made.append(('opened', 0))"]]
    for n in range(40):  # a clock set and a claim, taken by a cycle of workers, its answer asserted
        blocks += [[f"clock = {1000.0 + 0.125 * n!r}"],
                   [f"lease[{n + 3}] = ({workers[n % 3]}, 'g{{1}}+{n}', -{n}, 1e-05)",
                    f"made.append((clock, lease[{n + 3}], str({n})))"]]
    blocks += [[f"made.append(('{text}', 7))"] for text in "abcdefghijklm"]  # no step: written out
    blocks += [["made.append(('last', 8))"]]
    namespace_of = {}
    for way, lines in (("as written", [line for block in blocks for line in block]), ("folded", folded(blocks))):
        namespace = {"made": [], "lease": {}}
        exec("\n".join(lines), namespace)  # noqa: S102
        namespace_of[way] = (namespace["made"], namespace["lease"], len(lines))
    (made, leases, written), (looped, looped_leases, folded_lines) = namespace_of["as written"], namespace_of["folded"]
    assert made == looped and leases == looped_leases and len(made) == 55
    assert folded_lines == 4 + 13 + 2 and written == 1 + 3 * 40 + 13 + 1, folded(blocks)  # a loop for 120 lines
    assert len(blocks) - 1 - 13 - 1 >= LEAST
    # floats stay floats, bytes stay bytes, and values that never come round are left written out
    assert folded([[f"q0.nack(lease[{n}], {float(n)!r})"] for n in range(12)])[1] == \
        "    q0.nack(lease[n], (0.0 + 1.0 * n))"
    assert len(folded([[f"q0.publish(b'e{n}', 0)"] for n in range(12)])) == 12
    assert len(folded([[f"q0.publish({chr(97 + n)!r}, 0)"] for n in range(20)])) == 20
