"""harel_ref.stateful._async.in_line_calls: a search's calls in-line on a thread of its own,
watched for the call deadline.  What the certifier's hang tests (tests/test_certify.py) show
through a whole certification, here one piece at a time."""

from __future__ import annotations

import threading

import pytest

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
