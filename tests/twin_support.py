"""The machine test of an asyncio twin: half the examples of its sync class's.

A twin runs its sync class's core (DESIGN.md: one core per backend, its steps written once);
what is its own is the shell around it: the loop, the thread a call may run in, opening and
closing.  Every example runs each of those through every call, so half the examples still try
them hundreds of times, and the core's own cases stay with the sync class's test.  The twins'
machine tests were about 150 s of the suite's CPU at the profile's examples, the largest part of
the backend modules."""

from __future__ import annotations

from hypothesis import settings

__all__ = ["twin_settings"]


def twin_settings(of: settings) -> settings:
    """``of`` (the twin's own: a machine's ``TestCase.settings`` suppress every health check)
    with half its examples, at least 10."""
    return settings(parent=of, max_examples=max(10, of.max_examples // 2))
