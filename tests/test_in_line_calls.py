"""harel_ref.stateful._async.in_line_calls: a search's calls in-line on a thread of its own,
watched for the call deadline.  What the certifier's hang tests (tests/test_certify.py) show
through a whole certification, here one piece at a time."""

from __future__ import annotations

import collections
import os
import signal
import sys
import threading

import pytest

from harel_ref.certify import certify
from harel_ref.stateful import Capabilities

from harel_ref.stateful._async import (
    CallLimits,
    TransportCrashed,
    TransportHung,
    _call,
    _Watch,
    in_line_calls,
    limit_calls,
)

GENEROUS = 30.0
"""A deadline no call of these tests comes near but the hung ones (a loaded machine can keep a
thread from running for a second or more)."""


def test_calls_run_in_line_on_the_search_thread_and_its_error_is_raised_here():
    threads = []

    def body():
        threads.append(_call(limits, "claim", lambda: threading.current_thread()))
        raise ValueError("the search's own error")

    with limit_calls(GENEROUS) as limits, pytest.raises(ValueError, match="the search's own error"):
        in_line_calls(body, limits)
    searching = threads[0]
    assert searching is not threading.current_thread() and searching.name.startswith("harel-ref-search-")
    assert limits.broken is None


def test_a_call_past_the_deadline_is_a_hang_where_it_is_stuck_and_the_search_thread_is_abandoned():
    release, stuck, after = threading.Event(), [], []

    def claim_forever():  # as a transport whose lock is never released
        stuck.append(threading.current_thread())
        release.wait()
        return "an answer that comes too late"

    def body():
        try:
            after.append(_call(limits, "claim", claim_forever))
        except BaseException as exc:
            after.append(exc)
            raise

    with limit_calls(0.2) as limits:
        hung = in_line_calls(body, limits)
        assert isinstance(hung, TransportHung) and str(hung) == "hung: claim did not return within 0.2 s"
        assert limits.broken is hung
        names = [frame.f_code.co_name for frame in _frames(hung.__traceback__)]
        assert names.index("body") < names.index("claim_forever") < names.index("wait")  # where it is stuck
        with pytest.raises(TransportHung, match="so ack was not called"):
            _call(limits, "ack", lambda: True)  # the transport is not called again
    release.set()
    stuck[0].join(5)
    assert not stuck[0].is_alive()
    # the late answer reached no one: the call raised what unwinds the abandoned thread quietly
    assert [type(exc).__name__ for exc in after] == ["_Abandoned"]


def test_a_call_that_ends_its_thread_is_a_crash_and_the_search_goes_on():
    def body():
        with pytest.raises(TransportCrashed, match=r"crashed: nack ended the thread it ran on \(SystemExit: 3\)"):
            _call(limits, "nack", lambda: (_ for _ in ()).throw(SystemExit(3)))
        assert _call(limits, "ack", lambda: True) is True

    with limit_calls(GENEROUS) as limits:
        assert in_line_calls(body, limits) is None


def test_an_abandoned_watch_refuses_every_later_call():
    watch = _Watch()
    watch.abandoned = True
    with pytest.raises(BaseException) as raised:
        watch.call("publish", lambda: pytest.fail("called"))
    assert type(raised.value).__name__ == "_Abandoned"


def test_without_a_deadline_nothing_is_watched():
    limits = CallLimits(deadline=None)
    assert _call(limits, "claim", threading.current_thread) is threading.current_thread()


def _frames(tb):
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


# --- a stop in the middle of a search --------------------------------------------------------


class _Counted:
    """In-memory transports that count their opens and closes, and make ``stop()`` at the
    ``at``-th publish (from the search thread, as a signal or the memory watch would land)."""

    def __init__(self, at: int, stop) -> None:
        from harel_ref.transport import InMemoryStore

        self.at, self.stop, self.opened, self.closed, self.publishes = at, stop, 0, 0, 0
        self.stores = collections.defaultdict(InMemoryStore)

    def factory(self, clock, namespace):
        from harel_ref.transport import InMemoryTransport

        counted = self

        class Counted(InMemoryTransport):
            def publish(self, *args, **kwargs):
                counted.publishes += 1
                if counted.publishes == counted.at:
                    counted.stop()
                return super().publish(*args, **kwargs)

            def close(self):
                counted.closed += 1
                return super().close()

        self.opened += 1
        return Counted(clock=clock, store=self.stores[namespace])


def test_a_signal_during_a_search_closes_every_transport_it_opened():
    """SIGINT lands in the thread that watches the search; it is raised in the search thread
    too, whose example unwinds at once, through its teardown (on Python 3.11 a join that the
    signal interrupted let the watching thread go on at once and abandon the search thread:
    9 transports opened, 8 closed)."""
    counted = _Counted(at=200, stop=lambda: os.kill(os.getpid(), signal.SIGINT))
    before = set(threading.enumerate())  # a hung search an earlier test abandoned is still there
    with pytest.raises(KeyboardInterrupt) as stopped:
        certify(counted.factory, Capabilities(durable=True, shared=True), profile="quick", properties=["fifo"],
                jobs=1)
    assert counted.publishes >= 200 and counted.opened == counted.closed, (counted.opened, counted.closed)
    assert stopped.value.report.verdict("fifo").verdict == "unknown"
    assert not [thread for thread in set(threading.enumerate()) - before if thread.name.startswith("harel-ref-search-")]


def test_a_stop_whose_exception_takes_arguments_is_no_failure_of_the_transport():
    """The memory watch stops a run with MemoryLimitReached(used, limit); an exception raised in
    another thread is made without arguments, so the search thread is given one of its own.
    Given the watch's class, it raised TypeError inside the transport's call: fifo 'failed'."""
    from harel_ref.certify._memory import MemoryLimitReached
    from harel_ref.certify._signals import stop_from_thread

    counted = _Counted(at=200, stop=lambda: stop_from_thread(MemoryLimitReached(2**31, 2**30)))
    with pytest.raises(MemoryLimitReached) as stopped:
        certify(counted.factory, Capabilities(durable=True, shared=True), profile="quick", properties=["fifo"],
                jobs=1)
    assert stopped.value.report.verdict("fifo").verdict == "unknown", stopped.value.report.to_markdown()
    assert counted.opened == counted.closed


# --- an asyncio transport's search ------------------------------------------------------------


def test_an_asyncio_transports_search_runs_on_a_search_thread_of_its_own():
    """Its calls are tasks with their own deadlines, so it needs no watching; it runs on a
    thread of its own all the same, so that its cost does not depend on the caller's stack.
    On the caller's thread (CPython 3.11) a frame at the edge of a 16 KiB chunk of the
    thread's frame stack mapped and unmapped a chunk at every call: in a pytest-xdist worker,
    whose stack is deeper, a certification of memory-async made 687,000 mmap calls, not
    50,000, and took 4.9 to 8.4 s of CPU, not 3.4 s (docs/certify-speed.md)."""
    from stateful.backends.memory import AsyncInMemoryTransport
    from harel_ref.transport import InMemoryStore

    stores, threads = collections.defaultdict(InMemoryStore), set()

    class Recorded(AsyncInMemoryTransport):
        async def claim(self, *args, **kwargs):
            if _in_an_example():  # not the round trips that time the transport before the searches
                threads.add(threading.current_thread())
            return await super().claim(*args, **kwargs)

    async def factory(clock, namespace):
        return Recorded(clock, stores[namespace])

    report = certify(factory, Capabilities(durable=True, shared=True), is_async=True, profile="quick",
                     properties=["fifo"], jobs=1)
    assert report.verdict("fifo").verdict == "passed", report.to_markdown()
    assert threads and threading.current_thread() not in threads
    assert {thread.name for thread in threads} == {f"harel-ref-search-{threading.current_thread().name}"}, threads


def _in_an_example() -> bool:
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "_run_examples":
        frame = frame.f_back
    return frame is not None


def test_a_stop_inside_an_asyncio_transports_call_still_lets_the_teardown_close_it():
    """A SIGINT raised inside a call's task, on the thread that runs the loop, leaves the task
    of the call pending; the example's teardown then ran the loop again to close the transports,
    which resumed that task and raised the stop again, out of close(): 8 transports opened, 7
    closed.  The call's task is cancelled as the stop leaves the loop.  Without a call deadline
    the search runs on this thread, where the signal's handler raises the stop right after the
    ``os.kill``, inside the publish's task, every time (on a search thread the stop is raised at
    whatever point the thread has reached)."""
    from stateful.backends.memory import AsyncInMemoryTransport

    counted = _Counted(at=200, stop=lambda: os.kill(os.getpid(), signal.SIGINT))

    class Counted(AsyncInMemoryTransport):
        async def publish(self, *args, **kwargs):
            counted.publishes += 1
            if counted.publishes == counted.at:
                counted.stop()
            return await super().publish(*args, **kwargs)

        async def close(self):
            counted.closed += 1
            await super().close()

    async def factory(clock, namespace):
        counted.opened += 1
        return Counted(clock, counted.stores[namespace])

    with pytest.raises(KeyboardInterrupt) as stopped:
        certify(factory, Capabilities(durable=True, shared=True), is_async=True, profile="quick",
                properties=["fifo"], jobs=1, call_deadline=None)
    assert counted.publishes >= 200 and counted.opened == counted.closed, (counted.opened, counted.closed)
    assert stopped.value.report.verdict("fifo").verdict == "unknown"


def test_a_plain_factory_of_an_asyncio_transport_is_called_inside_the_loop_its_calls_run_on():
    """A factory that is a plain function, for a transport of ``async def`` methods, may ask for
    the current event loop (``asyncio.get_event_loop()``, as older libraries do): it gets the
    loop the transport's calls will run on, on a search thread too (where a thread has no
    current loop of its own, and the call raised RuntimeError)."""
    import asyncio

    from stateful.backends.memory import AsyncInMemoryTransport
    from harel_ref.transport import InMemoryStore

    stores, mismatched = collections.defaultdict(InMemoryStore), []

    class OnItsLoop(AsyncInMemoryTransport):
        def __init__(self, clock, store):
            super().__init__(clock, store)
            self.loop = asyncio.get_event_loop()

        async def claim(self, *args, **kwargs):
            if asyncio.get_running_loop() is not self.loop:
                mismatched.append(threading.current_thread().name)
            return await super().claim(*args, **kwargs)

    def factory(clock, namespace):
        return OnItsLoop(clock, stores[namespace])

    report = certify(factory, Capabilities(durable=True, shared=True), is_async=True, profile="quick",
                     properties=["fifo"], jobs=1)
    assert report.verdict("fifo").verdict == "passed", report.to_markdown()
    assert not mismatched
