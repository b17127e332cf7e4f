"""``with`` (and ``async with``) closes every reference transport at the end of the block, also
when the block raises (SPEC.md R14: afterwards calls raise TransportClosedError)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

import harel_ref.transport as transports
from harel_ref.transport import TransportClosedError


def opened(kind: str, tmp_path):
    if kind == "InMemoryTransport":
        return transports.InMemoryTransport()
    return getattr(transports, kind)(tmp_path / "queue.db")


@pytest.mark.parametrize("kind", ["InMemoryTransport", "SqliteTransport", "LibsqlTransport"])
@pytest.mark.parametrize("raises", [False, True])
def test_with_closes_the_transport(kind, raises, tmp_path):
    transport = opened(kind, tmp_path)
    with pytest.raises(RuntimeError) if raises else contextlib.nullcontext():
        with transport as entered:
            assert entered is transport
            entered.publish("g1", "e")
            if raises:
                raise RuntimeError("the block failed")
    with pytest.raises(TransportClosedError):
        transport.publish("g1", "e")


@pytest.mark.parametrize("kind", ["AsyncSqliteTransport", "AsyncLibsqlTransport"])
@pytest.mark.parametrize("raises", [False, True])
def test_async_with_closes_the_transport(kind, raises, tmp_path):
    async def scenario():
        transport = await getattr(transports, kind).create(tmp_path / "queue.db")
        with pytest.raises(RuntimeError) if raises else contextlib.nullcontext():
            async with transport as entered:
                assert entered is transport
                await entered.publish("g1", "e")
                if raises:
                    raise RuntimeError("the block failed")
        with pytest.raises(TransportClosedError):
            await transport.publish("g1", "e")

    asyncio.run(scenario())
