"""What a transport declares about its ids and its time (``Capabilities.group_ids`` and
``resolution``) decides what the checkers give it: SQS takes printable ASCII ids and whole
seconds.  Each declaration is shown to matter: the transport that needs it fails without it."""

from __future__ import annotations

import ast
import re

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from harel_ref._cli import main
from harel_ref.certify._target import CertificationError, capability_flags, parse_capabilities
from harel_ref.stateful import Backend, Capabilities, make_machine
from harel_ref.stateful._backend import GROUPS
from harel_ref.stateful._machine import Choices
from harel_ref.stateful.parallel import wall_visibility
from harel_ref.transport import InMemoryStore, InMemoryTransport

SQS_IDS = r"[!-~]{1,128}"
RUN = settings(max_examples=40, stateful_step_count=15, deadline=None, derandomize=True, database=None,
               suppress_health_check=list(HealthCheck),
               report_multiple_bugs=False)  # one failure, shrunk: each distinct one took 36 s in all
UNSHRUNK = settings(RUN, phases=[Phase.explicit, Phase.generate])
"""For the run that must fail: what it fails at is asserted, not how short it is (shrinking it
took 16 of the test's 17 s of CPU)."""


class AsciiIdsOnly(InMemoryTransport):
    """Refuses a group id that is not 1 to 128 printable ASCII characters, as SQS does."""

    def publish(self, group_id, event, priority=0, routing_key=None):
        if isinstance(group_id, str) and not re.fullmatch(SQS_IDS, group_id):
            raise ValueError(f"MessageGroupId can only include printable ASCII: {group_id!r}")
        return super().publish(group_id, event, priority, routing_key)


class WholeSecondsOnly(InMemoryTransport):
    """Refuses a lease or delay that is not a whole number of seconds, as boto3 does for SQS."""

    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        if isinstance(visibility, float) and not visibility.is_integer():
            raise ValueError(f"VisibilityTimeout must be whole seconds, got {visibility!r}")
        return super().claim(worker_id, visibility, min_priority, routing_keys)

    def nack(self, lease, delay=0.0):
        if isinstance(delay, float) and not delay.is_integer():
            raise ValueError(f"VisibilityTimeout must be whole seconds, got {delay!r}")
        return super().nack(lease, delay)


def _machine(cls, caps: Capabilities):
    stores: dict[str, InMemoryStore] = {}

    def factory(clock, namespace):
        return cls(clock=clock, store=stores.setdefault(namespace, InMemoryStore()))

    return make_machine(Backend(cls.__name__, factory, caps))


def test_the_default_choices_are_the_machine_constants():
    choices = Choices.of(Capabilities())
    assert choices.draws_like(Choices.DEFAULT) and choices.scale == 1.0
    assert "grüppe-✓" in choices.groups  # the checkers try a non-ASCII id by default


def test_ids_a_transport_refuses_are_replaced_by_ones_it_accepts():
    assert Choices.of(Capabilities(group_ids=SQS_IDS)).groups == ("g1", "g2", "g3", "g-4.~")
    assert Choices.of(Capabilities(group_ids="[a-z0-9]+")).groups == ("g1", "g2", "g3", "g4")
    with pytest.raises(ValueError, match="fewer than two"):
        Capabilities(group_ids="only-this")  # refused when declared, before any search


def test_a_transport_that_refuses_non_ascii_ids_fails_unless_it_declares_them():
    with pytest.raises(Exception) as failed:
        run_state_machine_as_test(_machine(AsciiIdsOnly, Capabilities(durable=True, shared=True)), settings=UNSHRUNK)
    # the machine drew an id that is not printable ASCII (which one follows Hypothesis's stream)
    refused = re.search(r"printable ASCII: (.*)$", str(failed.value))
    assert refused and not re.fullmatch(SQS_IDS, ast.literal_eval(refused[1])), failed.value
    run_state_machine_as_test(_machine(AsciiIdsOnly, Capabilities(durable=True, shared=True, group_ids=SQS_IDS)),
                              settings=RUN)


def test_a_declared_resolution_gives_whole_multiples_of_it():
    wall = Choices.of(Capabilities(clock="wall", resolution=1.0))
    assert wall.scale == 1.0 and set(wall.visibilities) | set(wall.delays) <= {1.0, 2.0, 3.0}
    injectable = Choices.of(Capabilities(resolution=2.0))
    assert injectable.scale == 1.0 and injectable.visibilities == (2.0, 4.0, 6.0) and injectable.delays == (2.0, 4.0)
    assert wall_visibility(Capabilities(clock="wall", resolution=1.0)) == 1.0
    assert wall_visibility(Capabilities(clock="wall", resolution=0.015)) == pytest.approx(0.03)


def test_a_transport_of_whole_seconds_fails_unless_it_declares_its_resolution():
    with pytest.raises(Exception) as failed:
        run_state_machine_as_test(_machine(WholeSecondsOnly, Capabilities(durable=True, shared=True)), settings=UNSHRUNK)
    assert "whole seconds" in repr(failed.value) + repr(failed.value.__cause__)
    run_state_machine_as_test(_machine(WholeSecondsOnly, Capabilities(durable=True, shared=True, resolution=1.0)),
                              settings=RUN)


def test_bad_declarations_are_refused_with_what_was_wrong():
    for bad, message in ((dict(resolution=-1.0), "resolution"), (dict(resolution=float("nan")), "resolution"),
                         (dict(resolution="1"), "resolution"), (dict(group_ids="[unclosed"), "regular expression"),
                         (dict(group_ids=3), "regular expression")):
        with pytest.raises((TypeError, ValueError), match=message):
            Capabilities(**bad)
    assert parse_capabilities("resolution=1,wall-clock") == {"resolution": 1.0, "clock": "wall"}
    with pytest.raises(CertificationError, match="number of seconds"):
        parse_capabilities("resolution=soon")


def test_the_cli_takes_both_and_says_them_back(tmp_path):
    declared = Capabilities()
    caps = Capabilities(resolution=1.0, group_ids=SQS_IDS)
    assert capability_flags(caps, declared) == ["--resolution", "1.0", "--group-ids", SQS_IDS]
    code = main(["certify", "--bundled", "memory", "--profile", "quick/4", "--only", "fifo", "--quiet",
                 "--resolution", "1", "--group-ids", SQS_IDS, "--report-dir", str(tmp_path)])
    assert code == 0
    report = (tmp_path / "report.json").read_text()
    assert '"resolution": 1.0' in report and '"group_ids": "[!-~]{1,128}"' in report
    with pytest.raises(SystemExit):
        main(["certify", "--bundled", "memory", "--resolution", "-2"])


def test_the_default_group_ids_still_include_one_beyond_ascii():
    assert any(not group.isascii() for group in GROUPS)


def test_the_soak_and_the_concurrent_search_keep_to_the_declarations():
    """The soak rounds its durations up to whole resolutions and waits them out; the concurrent
    search's programs use ids the transport accepts."""
    from hypothesis import given

    from harel_ref.stateful.parallel import Publish, programs
    from harel_ref.stateful.soak import _Choices

    soak = _Choices.of(Capabilities(resolution=1.0, group_ids="[a-z0-9]+"))
    assert soak.visibilities == (1.0,) and soak.delays == (1.0,) and soak.settle >= 1.5
    assert all(re.fullmatch("[a-z0-9]+", group) for group in soak.groups)
    groups = Choices.of(Capabilities(group_ids="g[34]|G4")).groups[:2]  # g1 and g2 are refused
    assert len(set(groups)) == 2 and all(re.fullmatch("g[34]|G4", group) for group in groups)

    @settings(max_examples=30, database=None)
    @given(programs(groups=groups))
    def only_those(program):
        ops = [*program.prefix, *(op for branch in program.branches for op in branch)]
        assert {op.group for op in ops if isinstance(op, Publish)} <= set(groups)

    only_those()
