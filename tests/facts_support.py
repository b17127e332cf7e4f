"""What a checker saw, in the property table's words: for tests that assert which property a
divergence, a linearizability answer or a concurrent failure counts against."""

from harel_ref.certify._verdicts import Searched, blame
from harel_ref.stateful._properties import PROPERTIES, SHARED, owner


def property_of(seen) -> str:
    """The property that owns the kind of fact ``seen`` (a Divergence, a ConcurrencyFailure, a
    Linearizability answer or a report's Failure) shows."""
    return owner(seen.kind)


def blamed(seen, search: str) -> str:
    """The property what ``seen`` shows counts against when the search ``search`` (a property's
    own, or ``"shared"``) found it: what came before it may make it another's."""
    covers = tuple(p for p, row in PROPERTIES.items() if row.search == "lockstep") if search == SHARED else (search,)
    return blame(getattr(seen, "fact", seen), Searched(search, covers, "failed"))


def replay(steps: list[str], target, search: str):
    """The Divergence that running ``steps`` (``state = Machine()`` ... ``state.teardown()``, as a
    report prints them) on the focus machine of ``search`` raises, or None if they pass."""
    from harel_ref.certify import focus_machine
    from harel_ref.stateful import Divergence

    name = steps[0].removeprefix("state = ").removesuffix("()")
    namespace = {name: focus_machine(target.factory, search, target.capabilities, is_async=target.is_async)}
    try:
        try:
            exec("\n".join(step for step in steps if step != "state.teardown()"), namespace)
        finally:
            if (state := namespace.get("state")) is not None:
                state.teardown()  # drains and compares unless a step failed; closes in any case
    except Divergence as divergence:
        return divergence
    return None
