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
import re
from collections.abc import Callable, Iterator
from typing import Any

from harel_ref.testing.servers import SqsServer

from ._server import ServerFromEnv, removed_at_exit

__all__ = ["GROUP_IDS", "REGION", "client", "create_queue", "delete_opened", "open_namespace", "queue_name",
           "server_url"]

GROUP_IDS = r"[!-~]{1,128}"
"""The group ids SQS accepts (``MessageGroupId``): 1 to 128 printable ASCII characters."""

REGION = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")

_SERVER = ServerFromEnv("HAREL_SQS_URL", SqsServer)
_QUEUE_PREFIX = re.compile(r"[A-Za-z0-9_-]{1,75}")


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


def queue_name(prefix: str) -> str:
    """The FIFO queue of a prefix (SQS: letters, digits, ``-`` and ``_``, at most 80 with ``.fifo``)."""
    if not isinstance(prefix, str) or not _QUEUE_PREFIX.fullmatch(prefix):
        raise ValueError(f"a queue prefix is 1 to 75 letters, digits, '-' or '_', got {prefix!r}")
    return f"{prefix}.fifo"


QUEUE_ATTRIBUTES = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}


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
