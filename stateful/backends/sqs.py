"""The SQS server the SQS transports run on, for the checkers.

The server comes from the environment or is started here, as for Postgres
(:mod:`harel_ref.stateful.backends.postgres`):

- ``HAREL_SQS_URL`` (``http://host:port``, an SQS endpoint: ElasticMQ, LocalStack, or AWS's
  ``https://sqs.<region>.amazonaws.com`` with credentials from the environment): each namespace
  becomes one FIFO queue there, ``<prefix>.fifo``, and the queues this process made are deleted
  when it ends (:func:`delete_opened`).  Nothing else is touched.
- unset: a throwaway ElasticMQ of this process (:class:`~harel_ref.testing.servers.SqsServer`,
  from Maven Central), started on first use and stopped at exit.  Each pytest-xdist worker gets
  its own.

What SQS cannot promise is declared, not failed (SPEC.md R15, SQS): leases and delays are whole
seconds (``resolution=1``) kept on the server's clock (``clock="wall"``), group ids are printable
ASCII of at most 128 characters (:data:`GROUP_IDS`), and which group a receive serves is the
server's choice (``fairness="unspecified"``: ElasticMQ serves the oldest group first, with no
round-robin).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harel_ref.testing.servers import SqsServer
from harel_ref.transport.sqs import GROUP_IDS, MAX_BODY, QUEUE_ATTRIBUTES, queue_name

from .._backend import Backend, Capabilities
from ._server import ServerFromEnv, removed_at_exit

__all__ = ["CAPABILITIES", "GROUP_IDS", "QUEUE_ATTRIBUTES", "REGION", "client", "create_queue", "delete_opened",
           "open_namespace", "queue_name", "server_url", "sqs", "sqs_async"]

REGION = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")

CAPABILITIES = Capabilities(
    priority=False, routing=False, durable=True, shared=True, acks="until-reclaimed", fairness="unspecified",
    clock="wall", resolution=1.0, group_ids=GROUP_IDS, event_bytes=(MAX_BODY - 2) // 6)
"""What SQS FIFO is (SPEC.md R10a, R15; docs/sqs.md): whole seconds on the server's clock,
printable ASCII ids, bodies of 256 KiB (an event of NULs takes 6 bytes a character once escaped), no order between groups, no priorities or routing keys, and a receipt
handle good until its message is received again."""

_SERVER = ServerFromEnv("HAREL_SQS_URL", SqsServer)


def server_url() -> str:
    """``$HAREL_SQS_URL``, else the URL of the throwaway server of this process (or of the
    process that spawned it), started now if it is not running yet."""
    return _SERVER.url()


def credentials() -> dict[str, str]:
    """The environment's AWS credentials, else any (ElasticMQ takes whatever it is given)."""
    return {"aws_access_key_id": os.environ.get("AWS_ACCESS_KEY_ID", "harel-ref"),
            "aws_secret_access_key": os.environ.get("AWS_SECRET_ACCESS_KEY", "harel-ref")}


def client(url: str) -> Any:
    """A boto3 SQS client of the endpoint ``url``."""
    import boto3

    return boto3.client("sqs", endpoint_url=url, region_name=REGION, **credentials())


def async_client(url: str) -> Any:
    """An aiobotocore SQS client of ``url``, to be entered (``async with``)."""
    from aiobotocore.session import get_session

    return get_session().create_client("sqs", endpoint_url=url, region_name=REGION, **credentials())


def create_queue(sqs: Any, prefix: str) -> str:
    """Create the FIFO queue of ``prefix`` if it is missing; return its URL."""
    return sqs.create_queue(QueueName=queue_name(prefix), Attributes=QUEUE_ATTRIBUTES)["QueueUrl"]


def _delete_queue(sqs: Any, prefix: str) -> None:
    try:
        url = sqs.get_queue_url(QueueName=queue_name(prefix))["QueueUrl"]
    except sqs.exceptions.QueueDoesNotExist:
        return
    sqs.delete_queue(QueueUrl=url)


def open_namespace(namespace: str, check: Callable[[str], Any]) -> tuple[str, str]:
    """The server's URL and a prefix for ``namespace`` that ``check`` and :func:`queue_name`
    accept; its queue is deleted when this process ends, if the server is the user's."""

    def valid(prefix: str) -> None:
        check(prefix)
        queue_name(prefix)

    return _SERVER.open(namespace, valid, _delete_queue)


@contextlib.contextmanager
def _connected(url: str) -> Iterator[Any]:
    sqs = client(url)
    try:
        yield sqs
    finally:
        sqs.close()


@removed_at_exit
def delete_opened() -> int:
    """Delete the queue of every prefix this process opened on the server of
    ``HAREL_SQS_URL``; return how many.  (A throwaway server goes as a whole.)"""
    return _SERVER.remove_opened(_connected)


def _opened_prefix(namespace: str) -> tuple[str, str]:
    return open_namespace(namespace, lambda prefix: None)


def sqs(tmp_dir: Path | str | None = None) -> Backend:
    """SqsTransport (``tmp_dir`` is not used; the clock neither: SQS keeps time)."""
    from harel_ref.transport import SqsTransport

    def factory(clock, namespace):
        url, prefix = _opened_prefix(namespace)
        return SqsTransport(url, prefix=prefix, region=REGION, client_options=credentials())

    return Backend("sqs", factory, CAPABILITIES)


def sqs_async(tmp_dir: Path | str | None = None) -> Backend:
    """AsyncSqsTransport (``tmp_dir`` is not used; the clock neither: SQS keeps time)."""
    from harel_ref.transport import AsyncSqsTransport

    async def factory(clock, namespace):
        url, prefix = _opened_prefix(namespace)
        return await AsyncSqsTransport.create(url, prefix=prefix, region=REGION, client_options=credentials())

    return Backend("sqs-async", factory, CAPABILITIES, is_async=True)
