"""Hypothesis settings profiles for the lockstep machine.

- ``dev``: quick feedback while editing (the default).
- ``ci``: derandomized (the same examples every run), deeper, no example database.
- ``thorough``: for certification runs; many more and longer examples.

Select one with ``HYPOTHESIS_PROFILE=ci`` (the test suite's conftest reads it) or
``settings.load_profile("ci")``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILES", "load_from_env"]

_COMMON = dict(
    deadline=None,  # backends do I/O: a slow call is not a bug
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

PROFILES = {
    "dev": dict(max_examples=25, stateful_step_count=30, **_COMMON),
    "ci": dict(max_examples=60, stateful_step_count=40, derandomize=True, database=None,
               print_blob=True, **_COMMON),
    "thorough": dict(max_examples=500, stateful_step_count=80, print_blob=True, **_COMMON),
}

for _name, _values in PROFILES.items():
    settings.register_profile(_name, **_values)


def load_from_env(default: str = "dev") -> str:
    """Load the profile named by ``$HYPOTHESIS_PROFILE`` (or ``default``); return its name."""
    name = os.environ.get("HYPOTHESIS_PROFILE", default)
    if name not in PROFILES:
        raise ValueError(f"HYPOTHESIS_PROFILE={name!r} is not one of {sorted(PROFILES)}")
    settings.load_profile(name)
    return name
