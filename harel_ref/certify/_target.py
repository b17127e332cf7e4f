"""What is being certified: a factory, its capabilities, and how to name it in a replay.

A *target* is written ``module:factory`` (``examples.seeds_sqlite:factory``); the module is
imported with the current directory on ``sys.path``, as ``python -m`` would.  A factory may
declare its capabilities itself, so that its users need no flags:

- ``factory.capabilities = Capabilities(...)`` (an attribute of the function), else
- ``HAREL_CAPABILITIES = Capabilities(...)`` in the factory's module, else
- the defaults of :class:`harel_ref.stateful.Capabilities`.

CLI flags and ``--harel-capabilities`` override the declared ones field by field; the
``capabilities`` argument of ``certify`` replaces them whole.

A factory takes ``(clock, namespace)``, or only ``(clock)`` as harel.testing's ``make(clock)``
does: such a factory must open a fresh, empty queue on every call, and since it cannot open
the same storage twice, durability and sharing are not checked.  A transport of harel's own
Protocol is recognised by its ``claim``, which takes no ``routing_keys`` (:func:`detect_protocol`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harel_ref.stateful import Capabilities
from harel_ref.stateful._backend import HAREL_IMPLIES
from harel_ref.stateful._harel import call_factory, takes_namespace
from harel_ref.stateful._processes import FactoryRecipe

__all__ = [
    "CertificationError",
    "Target",
    "capability_flags",
    "detect_protocol",
    "parse_capabilities",
    "remove_directory",
    "scratch_directory",
]


class CertificationError(Exception):
    """The certification cannot start: the target, an option or the factory is wrong."""


@dataclass(frozen=True)
class Target:
    """A factory to certify, its resolved capabilities, and the code that names it."""

    name: str  # shown in reports: "module:factory", "--bundled NAME" or a function name
    factory: Callable
    capabilities: Capabilities
    is_async: bool
    declared: Capabilities  # what the factory declares; replays add flags for the rest
    cli_args: tuple[str, ...] | None  # how `harel-ref certify` names it, if it can
    setup: str  # Python that defines `factory` in a reproduction
    recipe: FactoryRecipe | None = None  # how another process builds the factory (--processes)
    explicit: frozenset[str] = frozenset()  # capabilities declared or given, never to be detected
    in_process: bool = False  # its storage lives in the process: branch processes would not see it
    lanes: int | None = None  # lanes asked for (--lanes) or a bundled default; a replay asks again (SPEC.md C2a)

    # --- ways to get one ------------------------------------------------------------------

    @classmethod
    def from_spec(cls, spec: str, overrides: Mapping[str, Any] | None = None, is_async: bool = False) -> Target:
        """``module:factory`` (the attribute may be dotted: ``pkg.mod:Class.make``)."""
        module_name, sep, attribute = spec.partition(":")
        if not sep or not module_name or not attribute:
            raise CertificationError(
                f"expected MODULE:FACTORY such as examples.seeds_sqlite:factory, got {spec!r}"
            )
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` does: local packages import
        try:
            obj: Any = importlib.import_module(module_name)
        except Exception as exc:  # not found, or the module itself fails (SyntaxError, ...)
            raise CertificationError(
                f"cannot import {module_name!r} (from {spec!r}): {type(exc).__name__}: {exc}"
            ) from exc
        for part in attribute.split("."):
            if not hasattr(obj, part):
                raise CertificationError(f"{module_name!r} has no attribute {attribute!r} (from {spec!r})")
            obj = getattr(obj, part)
        if not callable(obj):
            raise CertificationError(f"{spec} is {obj!r}, not a factory(clock, namespace)")
        declared = declared_capabilities(obj)
        is_async = is_async or inspect.iscoroutinefunction(obj)
        return cls(
            explicit=_explicit(obj, overrides),
            name=spec,
            factory=obj,
            capabilities=resolve(declared, overrides),
            is_async=is_async,
            declared=declared,
            cli_args=(spec, *(("--async",) if is_async and not inspect.iscoroutinefunction(obj) else ())),
            setup=_import_as_factory(module_name, attribute.split(".")[0])
            + (f"\nfactory = factory.{attribute.split('.', 1)[1]}" if "." in attribute else ""),
            recipe=FactoryRecipe(spec=spec, path=os.getcwd()),
        )

    @classmethod
    def from_bundled(cls, name: str, directory: Path, overrides: Mapping[str, Any] | None = None) -> Target:
        """A bundled transport (``harel_ref.stateful.backends.BUNDLED``) keeping its files in ``directory``."""
        from harel_ref.stateful.backends import BUNDLED, IN_PROCESS, load

        if name not in BUNDLED:
            raise CertificationError(f"unknown bundled transport {name!r}; choose from {sorted(BUNDLED)}")
        try:
            backend = load(name)(directory)
        except Exception as exc:  # a missing driver, an unreachable server
            raise CertificationError(f"the bundled transport {name!r} is not available: {type(exc).__name__}: {exc}") from exc
        return cls(
            explicit=frozenset(_FIELDS),  # a bundled backend declares all it is
            name=f"bundled {name}",
            factory=backend.factory,
            capabilities=resolve(backend.capabilities, overrides),
            is_async=backend.is_async,
            declared=backend.capabilities,
            cli_args=("--bundled", name),
            setup=(
                "import tempfile\nfrom harel_ref.stateful.backends import load\n"
                "files = tempfile.TemporaryDirectory()  # removed when the script ends\n"
                f"factory = load({name!r})(files.name).factory"
            ),
            recipe=FactoryRecipe(bundled=name, directory=str(directory)),
            in_process=name in IN_PROCESS,
            lanes=backend.lanes,
        )

    @classmethod
    def from_factory(cls, factory: Callable, capabilities: Capabilities | None, is_async: bool | None) -> Target:
        """A factory given to :func:`certify` directly."""
        if not callable(factory):
            raise TypeError(f"factory must be a callable factory(clock, namespace), got {factory!r}")
        if capabilities is not None and not isinstance(capabilities, Capabilities):
            raise TypeError(f"capabilities must be a harel_ref.stateful.Capabilities, got {capabilities!r}")
        declared = declared_capabilities(factory)
        spec = _importable_spec(factory)
        if is_async is None:
            is_async = inspect.iscoroutinefunction(factory)
        if spec is not None:
            module_name, attribute = spec.split(":")
            setup = _import_as_factory(module_name, attribute)
        else:
            setup = "factory = ...  # the factory you certified (it cannot be imported by name)"
        return cls(
            explicit=frozenset(_FIELDS) if capabilities is not None else _explicit(factory, None),
            name=spec or getattr(factory, "__qualname__", repr(factory)),
            factory=factory,
            capabilities=capabilities if capabilities is not None else declared,
            is_async=bool(is_async),
            declared=declared,
            cli_args=(spec, *(("--async",) if is_async and not inspect.iscoroutinefunction(factory) else ()))
            if spec else None,
            setup=setup,
            recipe=FactoryRecipe(spec=spec, path=os.getcwd()) if spec else None,
        )

    # --- how to replay ----------------------------------------------------------------------

    def command(self, profile: str, seed: int, only: str | None = None, *, branches: str = "both",
                soak: float | None = None) -> str | None:
        """The ``harel-ref certify`` command that runs the same searches again, with the
        branches where they ran (``both``, the default, needs no flag)."""
        if self.cli_args is None:
            return None
        args = ["harel-ref", "certify", *self.cli_args, *capability_flags(self.capabilities, self.declared)]
        args += ["--profile", profile, "--seed", str(seed)]
        if branches != "both":
            args.append(f"--{branches}")
        if soak:
            args += ["--soak", f"{soak:g}"]
        if only:
            args += ["--only", only]
        if self.lanes is not None:
            args += ["--lanes", str(self.lanes)]
        return shlex.join(args)

    def parallel_reproduction(self, search: str, program: Any, *, contention: bool, histories: bool,
                              repeats: int, branches: str) -> str:
        """Runnable Python: run the shrunk program of a parallel search as the search did, its
        branches in ``branches`` (threads, processes or both, run by run)."""
        run = (f"check_program(factory, program, {self.capabilities!r}, is_async={self.is_async}, "
               f"repeats={repeats}, contention={contention}, histories={histories}")
        lines = [
            f"# Replays the failing program of the {search!r} search: it runs it up to {repeats} times",
            "# and raises the ConcurrencyFailure at the first run the checker refuses.",
            "# Run it from the directory you certified in (the factory's module is found there).",
            "import os, sys; sys.path.insert(0, os.getcwd())",
            "from harel_ref.stateful import Capabilities",
            "from harel_ref.stateful.parallel import Ack, Claim, Lapse, Nack, Program, Publish, check_program",
        ]
        if branches == "threads" or self.recipe is None:
            return "\n".join([*lines, self.setup, "", f"program = {program}", run + ")"])
        recipe = repr(self.recipe)
        if self.recipe.bundled is not None:  # the files of the directory made below
            recipe = f"FactoryRecipe(bundled={self.recipe.bundled!r}, directory=directory)"
        setup = "\n".join("    " + line for line in self.setup.splitlines())
        return "\n".join([
            *lines,
            "from harel_ref.stateful._processes import BranchProcesses, FactoryRecipe",
            "",
            f"program = {program}",
            "",
            "if __name__ == '__main__':  # the branch processes import this file again: set up once",
            setup,
            f"    with BranchProcesses({recipe}, is_async={self.is_async}, "
            f"protocol={self.capabilities.protocol!r}) as processes:",
            f"        {run}, processes=processes{', alternate=True' * (branches == 'both')})",
        ])

    def reproduction(self, prop: str, steps: list[str]) -> str:
        """Runnable Python: build the focus machine, then run Hypothesis's shrunk steps."""
        if not steps:
            return ""
        machine = steps[0].removeprefix("state = ").removesuffix("()")
        return "\n".join([
            f"# Replays the failing example of the {prop!r} search; it raises the Divergence.",
            "# Run it from the directory you certified in (the factory's module is found there).",
            "import os, sys; sys.path.insert(0, os.getcwd())",
            "from harel_ref.certify import focus_machine",
            "from harel_ref.stateful import Capabilities",
            self.setup,
            "",
            f"{machine} = focus_machine(factory, {prop!r}, {self.capabilities!r}, is_async={self.is_async})",
            *steps,
        ])


_FIELDS = tuple(f.name for f in dataclasses.fields(Capabilities))


def _explicit(factory: Callable, overrides: Mapping[str, Any] | None) -> frozenset[str]:
    """The capabilities that were said, not to be detected: every one if the factory declares
    its capabilities, and those the command line overrides."""
    said = {k for k, v in (overrides or {}).items() if v is not None}
    if _declaration(factory) is not None:
        said.update(_FIELDS)
    return frozenset(said)


def _declaration(factory: Callable) -> tuple[str, Any] | None:
    """Where ``factory`` declares its capabilities, and what it declares there, if it does."""
    for where, found in (
        (f"{getattr(factory, '__qualname__', factory)}.capabilities", getattr(factory, "capabilities", None)),
        ("HAREL_CAPABILITIES", getattr(sys.modules.get(getattr(factory, "__module__", "")), "HAREL_CAPABILITIES", None)),
    ):
        if found is not None:
            return where, found
    return None


def declared_capabilities(factory: Callable) -> Capabilities:
    """``factory.capabilities``, else its module's ``HAREL_CAPABILITIES``, else defaults."""
    declaration = _declaration(factory)
    if declaration is None:
        return Capabilities()
    where, found = declaration
    if not isinstance(found, Capabilities):
        raise CertificationError(f"{where} must be a harel_ref.stateful.Capabilities, got {found!r}")
    return found


def resolve(declared: Capabilities, overrides: Mapping[str, Any] | None) -> Capabilities:
    """``declared`` with every override that is not None applied.  Switching to harel's
    Protocol also switches to what it implies (no routing keys, acks by seq) unless those are
    overridden too."""
    changes = {k: v for k, v in (overrides or {}).items() if v is not None}
    fields = {f.name for f in dataclasses.fields(Capabilities)}
    if unknown := set(changes) - fields:
        raise CertificationError(f"unknown capabilities {sorted(unknown)}; choose from {sorted(fields)}")
    if changes.get("protocol") == "harel" and declared.protocol != "harel":
        changes = {**HAREL_IMPLIES, **changes}
    try:
        return dataclasses.replace(declared, **changes)
    except (TypeError, ValueError) as exc:
        raise CertificationError(str(exc)) from exc


def parse_capabilities(text: str) -> dict[str, Any]:
    """Overrides from a comma list: ``durable,shared,no-routing,fairness=ack,wall-clock``
    (a field name sets it True, ``no-`` sets it False, ``field=value`` sets a value,
    ``resolution=1`` and ``event_bytes=65535`` numbers).  ``group_ids`` holds commas, so it has no place here: declare it
    on the factory, or give ``--group-ids``."""
    overrides: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if item in ("wall-clock", "no-wall-clock"):
            overrides["clock"] = "injectable" if item.startswith("no-") else "wall"
        elif sep and key.strip() == "resolution":
            try:
                overrides["resolution"] = float(value)
            except ValueError:
                raise CertificationError(f"resolution={value.strip()!r}: expected a number of seconds") from None
        elif sep and key.strip().replace("-", "_") == "event_bytes":
            if not value.strip().isdigit():
                raise CertificationError(f"event_bytes={value.strip()!r}: expected a whole number of bytes")
            overrides["event_bytes"] = int(value)
        elif sep:
            overrides[key.strip().replace("-", "_")] = value.strip()
        elif item.startswith("no-"):
            overrides[item[3:]] = False
        else:
            overrides[item] = True
    return overrides


def detect_protocol(target: Target) -> Target:
    """``target``, certified under harel's Protocol if its transport speaks it and nothing was
    said about the protocol; and checked for what a one-argument factory cannot do.

    harel's ``claim(worker_id, visibility, min_priority=0)`` takes at most three arguments,
    harel-ref's four (``routing_keys``): that is how the two are told apart.  What the
    Protocol implies (no routing keys, acks by seq) is applied where nothing else was said."""
    caps = target.capabilities
    if "protocol" not in target.explicit and _claims_like_harel(target):
        kept = {name: getattr(caps, name) for name in ("routing", "acks") if name in target.explicit}
        caps = resolve(caps, {"protocol": "harel", **kept})
        target = dataclasses.replace(target, capabilities=caps)
    if caps.protocol == "harel":
        target = _with_observed_acks(target)
    if not takes_namespace(target.factory) and (caps.durable or caps.shared):
        raise CertificationError(
            f"{target.name} is a one-argument factory(clock): it opens a fresh queue every call, so "
            "durability and sharing cannot be checked (they need factory(clock, namespace) to "
            "open the same storage again); declare them False or give the factory a namespace"
        )
    return target


def _with_observed_acks(target: Target) -> Target:
    """``target`` with ``acks`` as its transport behaves.  Under harel's Protocol ack and nack
    answer nothing, so what a stale one does is seen only by what follows; the model follows
    the declaration, so it is checked first (SPEC.md R20).  Two short probes, each on a fresh
    namespace: a lease lapses and the message is claimed again; then the stale lease acks (or
    nacks) and a third claim looks.  Acting by seq frees the group (the ack deleted the head, the
    nack freed it); fenced, the group is still held by the second claim.  On a wall clock the
    first lease is a short one (a whole multiple of the resolution) and lapses by sleeping."""
    seen = {release: _stale_release_acts(target, release) for release in ("ack", "nack")}
    if None in seen.values():
        return target  # a probe could not tell (the lease never lapsed, or a call failed)
    if seen["ack"] != seen["nack"]:
        raise CertificationError(
            f"{target.name}: a stale ack {'acts' if seen['ack'] else 'does nothing'} but a stale nack "
            f"{'acts' if seen['nack'] else 'does nothing'}; the model has one rule for both (acks='fenced', "
            "'until-reclaimed' or 'by-seq'), so this transport cannot be certified as it is"
        )
    observed = "by-seq" if seen["ack"] else "fenced"
    if observed == target.capabilities.acks or (observed, target.capabilities.acks) == ("fenced", "until-reclaimed"):
        return target  # the probes' stale lease was reclaimed: until-reclaimed does nothing there too
    if "acks" in target.explicit:
        raise CertificationError(
            f"{target.name} is declared acks={target.capabilities.acks!r}, but a stale ack and nack "
            f"{'acted on the message another worker held' if seen['ack'] else 'did nothing'}: declare acks={observed!r}"
        )
    return dataclasses.replace(target, capabilities=dataclasses.replace(target.capabilities, acks=observed))


def _stale_release_acts(target: Target, release: str) -> bool | None:
    """One probe of :func:`_with_observed_acks`: True if the stale ``release`` acted, False if
    it did nothing, None if the probe could not tell."""
    import asyncio
    import uuid

    from harel_ref.stateful._async import open_transport
    import time

    from harel_ref.stateful._machine import Choices, FakeClock
    from harel_ref.stateful.parallel import close_all, wall_visibility

    wall = target.capabilities.clock == "wall"
    clock = time.time if wall else FakeClock()
    first = wall_visibility(target.capabilities) if wall else 1.0
    loop = asyncio.new_event_loop() if target.is_async else None
    transport = None
    try:
        transport = open_transport(target.factory, clock, f"harel_ref_probe_{uuid.uuid4().hex[:8]}", loop, "harel")
        group = Choices.of(target.capabilities).groups[0]  # one the transport accepts
        transport.publish(group, "first")
        transport.publish(group, "second")
        stale = transport.claim("probe-1", first)
        if wall:
            time.sleep(first * 1.5 + 0.01)
        else:
            clock.now += 2.0
        current = transport.claim("probe-2", 60.0)
        if stale is None or current is None or (stale.event, current.event) != ("first", "first"):
            return None
        transport.ack(stale) if release == "ack" else transport.nack(stale, 0)
        third = transport.claim("probe-3", 60.0)
        return third is not None
    except Exception:
        return None  # the searches will say what is wrong
    finally:
        close_all([transport] if transport is not None else [], loop)


def _claims_like_harel(target: Target) -> bool:
    """Open one transport (without adapting it) and count its ``claim``'s parameters (one that
    takes ``*args`` or ``**kwargs`` cannot be told: it is taken as harel-ref's)."""
    import asyncio

    from harel_ref.stateful._machine import FakeClock

    loop = asyncio.new_event_loop() if target.is_async else None
    try:
        made = call_factory(target.factory, FakeClock(), "harel_ref_detect")
        if inspect.isawaitable(made):
            if loop is None:
                return False  # preflight says to declare it async
            made = loop.run_until_complete(made)
        try:
            parameters = inspect.signature(made.claim).parameters
        except (AttributeError, TypeError, ValueError):
            return False  # preflight says what is wrong with it
        finally:
            close = getattr(made, "close", None)
            closed = close() if callable(close) else None
            if inspect.isawaitable(closed) and loop is not None:
                loop.run_until_complete(closed)
        kinds = [p.kind for p in parameters.values()]
        if inspect.Parameter.VAR_POSITIONAL in kinds or inspect.Parameter.VAR_KEYWORD in kinds:
            return False
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return sum(kind in positional for kind in kinds) <= 3
    except Exception:
        return False  # the factory cannot open a transport: preflight says so
    finally:
        if loop is not None:
            loop.close()


def capability_flags(caps: Capabilities, declared: Capabilities) -> list[str]:
    """The ``harel-ref certify`` flags that turn ``declared`` into ``caps``."""
    flags = []
    for field in dataclasses.fields(Capabilities):
        value = getattr(caps, field.name)
        if value == getattr(declared, field.name):
            continue
        if field.name == "clock":
            flags.append("--wall-clock" if value == "wall" else "--no-wall-clock")
        elif isinstance(value, bool):
            flags.append(f"--{field.name}" if value else f"--no-{field.name}")
        else:
            flags += [f"--{field.name.replace('_', '-')}", str(value)]
    if "--protocol" in flags:  # it implies routing and acks when parsed: say them, as they are
        if f"--{'no-' if not caps.routing else ''}routing" not in flags:
            flags.append("--routing" if caps.routing else "--no-routing")
        if "--acks" not in flags:
            flags += ["--acks", caps.acks]
    return flags


def _import_as_factory(module_name: str, attribute: str) -> str:
    alias = "" if attribute == "factory" else " as factory"
    return f"from {module_name} import {attribute}{alias}"


def _importable_spec(factory: Callable) -> str | None:
    """``module:name`` if importing it gives back this very factory."""
    recipe = FactoryRecipe.by_name(factory)
    return None if recipe is None else recipe.spec


RAM_DIRECTORY = "/dev/shm"


def scratch_directory() -> str:
    """A new temporary directory for a bundled transport's files: in RAM (``/dev/shm``) when
    the machine has one and ``TMPDIR`` does not name another place, else the usual temporary
    directory.  A certification judges what a transport answers, and the same SQLite code runs
    on either: on a disk, most of its time goes into waiting for fsyncs (about a third of a
    standard run on the reference machine, docs/certify-speed.md).  The bundled backends remove
    each example's files when it ends (``factory.discard``), so RAM holds a few at a time."""
    ram = RAM_DIRECTORY if not os.environ.get("TMPDIR") and os.access(RAM_DIRECTORY, os.W_OK) else None
    return tempfile.mkdtemp(prefix="harel-ref-certify-", dir=ram)


def remove_directory(directory: str | os.PathLike[str], *, patience: float = 10.0) -> None:
    """Remove a bundled transport's temporary directory, whatever a stopped run left in it.

    After Ctrl-C or SIGTERM, threads of the interrupted search may still be finishing a call in
    it (a branch of a parallel search, a call thread): one that creates a file (a WAL, a new
    database) while the tree is being removed leaves the directory behind.  Nothing creates
    the directory again, so the removal is simply repeated until it is gone, for up to
    ``patience`` seconds; what is still there then is reported on stderr, not raised.
    """
    deadline = time.monotonic() + patience
    while True:
        shutil.rmtree(directory, ignore_errors=True)
        if not os.path.exists(directory):
            return
        if time.monotonic() > deadline:
            print(f"harel-ref: warning: {os.fspath(directory)!r} could not be removed: something "
                  "kept writing into it", file=sys.stderr)
            return
        time.sleep(0.05)
