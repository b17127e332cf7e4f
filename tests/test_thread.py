"""ConnectionThread: the thread an asyncio twin hands its blocking calls to, one job at a time.

What the SQLite twin relies on: every job runs in the one thread, in the order given, never two
at once; a job whose caller gave up still runs to its end before the next; errors reach the
caller; the thread serves one event loop after another; and it ends when stopped or dropped.
"""

import asyncio
import gc
import os
import threading
import time

import pytest

from harel_ref.transport._thread import ConnectionThread


def test_idle_waits_for_jobs_nobody_awaits_any_more_and_submitted_ones():
    """A job whose caller was cancelled, and a submitted one, still hold the connection: idle()
    returns only once both are done, and at once when nothing runs."""
    release = threading.Event()
    order = []

    async def main():
        worker = ConnectionThread("harel-ref test thread")
        await worker.idle()  # nothing given: at once
        abandoned = asyncio.ensure_future(worker.run(lambda: (release.wait(10), order.append("abandoned"))))
        await asyncio.sleep(0.01)
        abandoned.cancel()
        worker.submit(order.append, "submitted")
        assert worker.busy()
        waiting = asyncio.ensure_future(worker.idle())
        await asyncio.sleep(0.05)
        assert not waiting.done(), "idle() returned while a job still ran"
        release.set()
        await waiting
        order.append("idle")
        assert not worker.busy()
        await worker.stop()

    asyncio.run(main())
    assert order == ["abandoned", "submitted", "idle"]


def test_jobs_run_in_one_thread_in_order_one_at_a_time():
    seen, running = [], []

    def job(number):
        running.append(number)
        assert len(running) == 1, f"two jobs at once: {running}"
        time.sleep(0.001)
        seen.append((number, threading.current_thread().name))
        running.remove(number)
        return number * 10

    async def main():
        worker = ConnectionThread("harel-ref test thread")
        answers = await asyncio.gather(*(worker.run(job, n) for n in range(20)))
        await worker.stop()
        return answers

    assert asyncio.run(main()) == [n * 10 for n in range(20)]
    assert [number for number, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"harel-ref test thread"}


def test_an_error_reaches_the_caller_and_the_thread_goes_on():
    def fail():
        raise KeyError("the job's own error")

    async def main():
        worker = ConnectionThread("t")
        with pytest.raises(KeyError, match="the job's own error"):
            await worker.run(fail)
        answer = await worker.run(lambda: "still serving")
        await worker.stop()
        return answer

    assert asyncio.run(main()) == "still serving"


def test_a_cancelled_callers_job_runs_to_its_end_before_the_next_one():
    started, release, order = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        release.wait(10)
        order.append("slow, whose caller gave up")

    def after():
        order.append("the next job")

    async def main():
        worker = ConnectionThread("t")
        waiting = asyncio.ensure_future(worker.run(slow))
        while not started.is_set():
            await asyncio.sleep(0.001)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        following = asyncio.ensure_future(worker.run(after))
        await asyncio.sleep(0.05)
        assert not following.done(), "the next job ran while the cancelled one was still running"
        release.set()
        await following
        await worker.stop()

    asyncio.run(main())
    assert order == ["slow, whose caller gave up", "the next job"]


def test_it_serves_one_event_loop_after_another():
    worker_holder = []

    async def first():
        worker_holder.append(ConnectionThread("t"))
        return await worker_holder[0].run(lambda: "first loop")

    async def second():
        answer = await worker_holder[0].run(lambda: "second loop")
        await worker_holder[0].stop()
        return answer

    assert asyncio.run(first()) == "first loop"
    assert asyncio.run(second()) == "second loop"  # asyncio.run made a new loop and closed the first


def _threads_named(name):
    return [thread for thread in threading.enumerate() if thread.name == name]


def _wait_until_gone(name):
    for _ in range(500):
        if not _threads_named(name):
            return True
        time.sleep(0.01)
    return False


def test_stop_ends_the_thread_after_the_jobs_given():
    done = []

    async def main():
        worker = ConnectionThread("harel-ref thread that stops")
        pending = asyncio.ensure_future(worker.run(lambda: done.append("given before stop")))
        await asyncio.sleep(0)  # the job is in the thread's queue
        await pending
        await worker.stop()
        await worker.stop()  # a second stop is harmless

    asyncio.run(main())
    assert done == ["given before stop"]
    assert _wait_until_gone("harel-ref thread that stops")


def test_a_thread_nobody_stopped_ends_when_it_is_dropped():
    async def main():
        worker = ConnectionThread("harel-ref thread dropped")
        await worker.run(int)
        assert _threads_named("harel-ref thread dropped")
        del worker
        gc.collect()

    asyncio.run(main())
    assert _wait_until_gone("harel-ref thread dropped")


class _Owner:
    """Holds its thread, as a twin does, and gives it a job of its own (a checkpoint)."""

    def __init__(self, name):
        self.thread = ConnectionThread(name)

    def job(self):
        pass


def test_a_dropped_thread_ends_whatever_its_last_job_referred_to():
    """The thread holds nothing of its last job while it waits: a job bound to the object that
    holds the thread (a submitted checkpoint), or an error whose traceback reaches the caller's
    frame, kept an abandoned transport and its thread alive (a reviewer's find)."""
    async def main():
        submitted = _Owner("harel-ref thread, last job submitted")
        submitted.thread.submit(submitted.job)
        failed = _Owner("harel-ref thread, last job failed")
        with pytest.raises(ZeroDivisionError):
            await failed.thread.run(lambda: 1 / 0)
        while submitted.thread.busy():
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)  # the loop lets go of the handle that woke this task with the error
        del submitted, failed

    asyncio.run(main())
    for _ in range(500):  # collected once the thread has let go of its last job, at once or soon
        gc.collect()
        if not _threads_named("harel-ref thread, last job submitted") and not _threads_named("harel-ref thread, last job failed"):
            break
        time.sleep(0.01)
    assert _wait_until_gone("harel-ref thread, last job submitted")
    assert _wait_until_gone("harel-ref thread, last job failed")


def test_the_loop_closes_the_eventfd_of_a_thread_stopped_or_dropped():
    """Whether stopped or dropped, the thread's last word makes the loop stop watching its
    eventfd and close it (30 dropped transports once left 30 open: a reviewer's find)."""
    if not hasattr(os, "eventfd"):
        pytest.skip("no eventfd on this platform: the thread answers through call_soon_threadsafe")

    def is_eventfd(fd):
        try:
            return "eventfd" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False

    async def main():
        stopped, dropped, unused = ConnectionThread("t"), ConnectionThread("t"), ConnectionThread("t")
        await stopped.run(int)
        await dropped.run(int)
        fds = [stopped._wakeup, dropped._wakeup, unused._wakeup]  # unused: dropped before any call
        assert all(is_eventfd(fd) for fd in fds)
        await stopped.stop()
        del dropped, unused
        gc.collect()
        for _ in range(500):
            if not any(is_eventfd(fd) for fd in fds):
                return
            await asyncio.sleep(0.01)
        pytest.fail(f"eventfds still open: {[fd for fd in fds if is_eventfd(fd)]}")

    asyncio.run(main())


def test_stop_returns_after_the_threads_last_write():
    """The thread's last word is a write to the eventfd; the loop may read the word before the
    write lands.  stop() returns, and the eventfd is closed, only once the thread has ended:
    else the write hit a closed descriptor, or one reused by a file opened meanwhile (a
    reviewer saw it land in a database's header).  The last write is slowed here to widen the
    window that a GIL switch opens."""
    import harel_ref.transport._thread as module

    if not hasattr(os, "eventfd"):
        pytest.skip("no eventfd on this platform: the thread answers through call_soon_threadsafe")
    crashed, slow = [], threading.Event()
    hook, threading.excepthook = threading.excepthook, crashed.append
    write = os.eventfd_write

    def slowed(fd, value):
        if slow.is_set():
            time.sleep(0.05)
        write(fd, value)

    async def main():
        worker = ConnectionThread("harel-ref thread with a slow last word")
        await worker.run(int)
        pending = [asyncio.ensure_future(worker.run(int)) for _ in range(3)]
        slow.set()
        await asyncio.gather(worker.stop(), *pending)
        assert not _threads_named("harel-ref thread with a slow last word"), "stop() returned before the thread ended"

    module.os.eventfd_write = slowed
    try:
        asyncio.run(main())
    finally:
        module.os.eventfd_write = write
        threading.excepthook = hook
    assert not crashed, crashed
