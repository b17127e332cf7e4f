"""SqsTransport: the queue as one SQS FIFO queue, and its asyncio twin (boto3; the twin on
aiobotocore).  ``docs/sqs.md`` gives the design and what SQS cannot promise at length.

**The mapping.**  A group is a ``MessageGroupId``; SQS FIFO itself keeps a group's messages in
order and gives out no message of a group while another of it is in flight, so the queue *is*
the contract's state, and every operation is one request:

=========  ==================================================================================
publish    ``SendMessage``: the event as a JSON string (SQS bodies refuse NUL, U+FFFE and
           U+FFFF), a fresh ``MessageDeduplicationId`` (a publish is never dropped as a repeat)
claim      ``ReceiveMessage`` of one message, with ``VisibilityTimeout`` the lease: the lease's
           token is the receipt handle, its seq the message's ``SequenceNumber`` + 1
ack        ``DeleteMessage`` with the handle
nack       ``ChangeMessageVisibility`` with the handle: 0 frees the message (R8), ``delay`` parks
           it (R9)
=========  ==================================================================================

**What SQS decides, and the transport declares** (SPEC.md R10a, R15; ``SQS_CAPABILITIES``):

- time is the server's, in whole seconds (``clock="wall"``, ``resolution=1``): a lease or delay
  that is not a whole number of seconds is rounded *up* (a lease never ends before it was asked
  to), and more than 12 hours (SQS's limit) is refused;
- a group id is 1 to 128 printable ASCII characters (``GROUP_IDS``); anything else is refused;
- which group a receive serves is the server's choice (``fairness="unspecified"``);
- there are no priorities or routing keys: a publish with either is refused, and a claim for a
  priority above 0 or for routing keys gets None (no group has them);
- **a receipt handle stays good until its message is received again** (``acks="until-reclaimed"``,
  as ElasticMQ does; AWS documents departures, docs/sqs.md):
  after a nack, the lease that freed or parked the message can still ack or nack it, until
  some claim takes it again.  From then the handle is stale, and its ack or nack answers False
  (SQS's ``ReceiptHandleIsInvalid``), never an error.  SQS keeps no state a transport could
  compare with instead, so this is the fencing SQS can give (docs/sqs.md).

**Errors** (R17): a server that cannot be reached raises :class:`StorageError`, as does a
request the server refused (4xx); a request sent whose answer was lost (a timeout, a dropped
connection) or was a server error (5xx) raises :class:`OutcomeUnknownError`.  botocore's retries are turned off: a delete
retried after its answer was lost would answer False for a message it had deleted.
"""

from __future__ import annotations

import functools
import json
import math
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

from ._base import (
    ClockError,
    Lease,
    OutcomeUnknownError,
    StorageError,
    check_claim_args,
    check_delay,
    check_publish_args,
    default_clock,
    without_password,
)
from ._shell import AsyncShell, Shell, Steps

__all__ = ["AsyncSqsTransport", "GROUP_IDS", "MAX_BODY", "MAX_SECONDS", "QUEUE_ATTRIBUTES", "SqsTransport",
           "queue_name"]

GROUP_IDS = r"[!-~]{1,128}"
"""The group ids SQS accepts (``MessageGroupId``): 1 to 128 printable ASCII characters."""

MAX_SECONDS = 43_200
"""The longest visibility SQS keeps a message invisible: 12 hours."""

MAX_BODY = 262_144
"""The largest message body SQS takes, in bytes."""

QUEUE_ATTRIBUTES = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}
"""A queue of the transport: FIFO, each publish deduplicated only by its own fresh id."""

_QUEUE_PREFIX = re.compile(r"[A-Za-z0-9_-]{1,75}")
_SLACK = 1e-6  # a float product such as 3 * 0.1 * 10 is the whole second it was meant to be


def queue_name(prefix: str) -> str:
    """The FIFO queue of a prefix (SQS: letters, digits, ``-`` and ``_``, at most 80 with ``.fifo``)."""
    if not isinstance(prefix, str) or not _QUEUE_PREFIX.fullmatch(prefix):
        raise ValueError(f"a queue prefix is 1 to 75 letters, digits, '-' or '_', got {prefix!r:.80}")
    return f"{prefix}.fifo"


# --- The argument checks: what SQS takes (R13) -----------------------------------------------


def _whole_seconds(name: str, seconds: float) -> int:
    """``seconds`` rounded up to whole seconds, as SQS keeps them (anything above 0 is at least
    one); more than 12 hours refused."""
    whole = max(1 if seconds > 0 else 0, math.ceil(seconds - _SLACK))
    if whole > MAX_SECONDS:
        raise ValueError(f"{name} must be at most {MAX_SECONDS} seconds (12 hours, SQS's limit), got {seconds}")
    return whole


def encode(event: str) -> str:
    """An event as a message body SQS takes whatever the event holds: a JSON string, which
    escapes NUL and the other control characters, with U+FFFE and U+FFFF escaped too (SQS takes
    XML's characters only).  Everything else stays as it is, so UTF-8 keeps it short."""
    return json.dumps(event, ensure_ascii=False).replace("\ufffe", "\\ufffe").replace("\uffff", "\\uffff")


def check_publish(group_id: object, event: object, priority: object,
                  routing_key: object) -> tuple[str, str, int, str | None]:
    """R13's checks, then SQS's: an ASCII group id, no priority or routing key, a body that fits."""
    group_id, event, priority, routing_key = check_publish_args(group_id, event, priority, routing_key)
    if not re.fullmatch(GROUP_IDS, group_id):
        raise ValueError(f"group_id must be 1 to 128 printable ASCII characters ('!' to '~'), as SQS's "
                         f"MessageGroupId, got {group_id!r:.80}")
    if priority != 0:
        raise ValueError(f"SQS has no priorities: publish with priority 0, got {priority}")
    if routing_key is not None:
        raise ValueError(f"SQS has no routing keys: use a queue (prefix) per key, got routing_key={routing_key!r:.80}")
    if (size := len(encode(event).encode())) > MAX_BODY:
        raise ValueError(f"event is {size} bytes once encoded; SQS takes at most {MAX_BODY}")
    return group_id, event, priority, routing_key


def check_claim(worker_id: object, visibility: object, min_priority: object,
                routing_keys: Iterable[str] | None) -> tuple[str, float, int, tuple[str, ...] | None]:
    worker_id, visibility, min_priority, keys = check_claim_args(worker_id, visibility, min_priority, routing_keys)
    _whole_seconds("visibility", visibility)
    return worker_id, visibility, min_priority, keys


def check_sqs_delay(delay: object) -> float:
    delay = check_delay(delay)
    _whole_seconds("delay", delay)
    return delay


# --- The steps: one request each ------------------------------------------------------------


class Send(NamedTuple):
    group_id: str
    body: str


class Receive(NamedTuple):
    """One message, invisible for ``seconds``, or None."""

    seconds: int


class Delete(NamedTuple):
    """True, or False when the handle is stale."""

    handle: str


class ChangeVisibility(NamedTuple):
    """True, or False when the handle is stale."""

    handle: str
    seconds: int


class SqsCore:
    """The four operations as steps (:mod:`harel_ref.transport._shell`).  ``now`` is not used:
    SQS keeps time itself."""

    def publish(self, group_id: str, event: str, priority: int, routing_key: str | None) -> Steps[None]:
        yield Send(group_id, encode(event))

    def claim(self, token: str, now: float, visibility: float, min_priority: int,
              routing_keys: tuple[str, ...] | None) -> Steps[Lease | None]:
        if min_priority > 0 or routing_keys is not None:
            return None  # every group has priority 0 and no routing key (R4)
        message = yield Receive(_whole_seconds("visibility", visibility))
        if message is None:
            return None
        lease = _lease(message)
        if isinstance(lease, Lease):
            return lease
        yield ChangeVisibility(message["ReceiptHandle"], 0)  # give it back: the claim takes nothing
        raise StorageError(f"message {message.get('MessageId')!r} {lease}; it was left in the queue")

    def ack(self, lease: Lease, now: float) -> Steps[bool]:
        return (yield Delete(lease.token))

    def nack(self, lease: Lease, now: float, delay: float) -> Steps[bool]:
        return (yield ChangeVisibility(lease.token, _whole_seconds("delay", delay)))


def _lease(message: dict[str, Any]) -> Lease | str:
    """The lease of a received message, or what is wrong with it."""
    attributes = message.get("Attributes", {})
    try:
        group_id, event = attributes["MessageGroupId"], json.loads(message["Body"])
        seq = int(attributes["SequenceNumber"]) + 1
    except (KeyError, ValueError) as exc:
        return f"is not one of harel-ref's ({exc!r}): is another program sending to this queue?"
    if not isinstance(event, str):
        return f"holds {event!r:.80}, not an event of harel-ref's"
    if not 1 <= seq < 2**63:
        return f"has SequenceNumber {seq - 1}, beyond the 63 bits of a Lease.seq (SQS on AWS: docs/sqs.md)"
    return Lease(group_id, event, seq, message["ReceiptHandle"])  # the handle is the token (R16)


# --- The drivers ----------------------------------------------------------------------------


def _request(client: Any, queue_url: str, wait_seconds: int, step: Any) -> Any:
    """The botocore call of ``step``, not yet made: awaitable on an aiobotocore client."""
    if isinstance(step, Send):
        return client.send_message(QueueUrl=queue_url, MessageBody=step.body, MessageGroupId=step.group_id,
                                   MessageDeduplicationId=uuid.uuid4().hex)
    if isinstance(step, Receive):
        return client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=1, VisibilityTimeout=step.seconds,
                                      WaitTimeSeconds=wait_seconds,
                                      MessageSystemAttributeNames=["MessageGroupId", "SequenceNumber"])
    if isinstance(step, Delete):
        return client.delete_message(QueueUrl=queue_url, ReceiptHandle=step.handle)
    return client.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=step.handle,
                                            VisibilityTimeout=step.seconds)


def _answer(step: Any, result: Any) -> Any:
    if isinstance(step, Receive):
        messages = result.get("Messages") or []
        return messages[0] if messages else None
    return None if isinstance(step, Send) else True


def _refused(step: Any, exc: Exception) -> bool:
    """False for a release whose handle is stale (R10, R10a); any other error is raised."""
    code = (getattr(exc, "response", None) or {}).get("Error", {}).get("Code")
    if isinstance(step, (Delete, ChangeVisibility)) and code == "ReceiptHandleIsInvalid":
        return False
    raise exc


@contextmanager
def _errors(url: str, operation: str) -> Iterator[None]:
    """botocore's errors as R17 says."""
    from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as CannotConnect  # refused, timed out, or TLS failed

    try:
        yield
    except (StorageError, ClockError, OutcomeUnknownError, ValueError, TypeError):
        raise
    except CannotConnect as exc:  # nothing was sent
        raise StorageError(f"{operation} on {without_password(url)} failed: cannot connect ({exc}); is the server up?") from exc
    except (HTTPClientError, ClientError) as exc:
        status = (getattr(exc, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if isinstance(exc, ClientError) and status < 500:  # the server refused it: it did nothing
            raise StorageError(f"{operation} on {without_password(url)} failed: {exc}") from exc
        # sent, and the answer was lost (a timeout, a dropped connection) or was a server error
        raise OutcomeUnknownError(
            f"{operation} on {without_password(url)}: no answer ({exc}); it may or may not have taken effect (SPEC R17)"
        ) from exc
    except BotoCoreError as exc:  # raised before anything was sent (a bad parameter, no credentials)
        raise StorageError(f"{operation} on {without_password(url)} failed: {exc}") from exc


def _config(timeout: float, wait_seconds: int, config_class: Any) -> Any:
    # No retries: see the module's docstring.  A claim may wait wait_seconds for a message
    # before the server answers: the answer is awaited that much longer.
    return config_class(retries={"total_max_attempts": 1}, connect_timeout=timeout,
                        read_timeout=timeout + wait_seconds)


def _client_arguments(url: str, region: str, client_options: Mapping[str, Any] | None) -> dict[str, Any]:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be an SQS endpoint such as http://127.0.0.1:9324, got {url!r:.80}")
    return {"endpoint_url": url, "region_name": region, **(client_options or {})}


class SqsTransport(Shell):
    """The queue in the SQS FIFO queue ``<prefix>.fifo`` (created if missing) at the endpoint
    ``url`` (ElasticMQ's ``http://127.0.0.1:9324``, or ``https://sqs.<region>.amazonaws.com``).
    Thread-safe (a boto3 client).

    - ``prefix``: the queue's name without ``.fifo`` (``harel`` by default).
    - ``region``, ``client_options``: for ``boto3.client("sqs", ...)`` (credentials, for one;
      by default boto3 finds them in the environment).
    - ``wait_seconds``: how long a claim waits for a message (SQS's long polling; 0: answer at once).
    - ``timeout``: seconds a request may take before :class:`OutcomeUnknownError`.
    """

    _check_publish = staticmethod(check_publish)
    _check_claim = staticmethod(check_claim)
    _check_delay = staticmethod(check_sqs_delay)

    def __init__(self, url: str, *, prefix: str = "harel", region: str = "us-east-1",
                 client_options: Mapping[str, Any] | None = None, wait_seconds: int = 0,
                 timeout: float = 10.0) -> None:
        import boto3
        from botocore.config import Config

        name, self.url, self._wait = queue_name(prefix), url, _check_wait(wait_seconds)
        self._core, self._clock = SqsCore(), default_clock
        self._client = boto3.client("sqs", config=_config(timeout, self._wait, Config),
                                    **_client_arguments(url, region, client_options))
        try:
            with _errors(url, "open"):
                self.queue_url = self._client.create_queue(QueueName=name, Attributes=QUEUE_ATTRIBUTES)["QueueUrl"]
        except BaseException:
            self._client.close()
            raise

    def _perform(self, operation: str, step: Any) -> Any:
        with _errors(self.url, operation):
            try:
                return _answer(step, _request(self._client, self.queue_url, self._wait, step))
            except Exception as exc:
                return _refused(step, exc)

    def _release(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"<SqsTransport {self.queue_url}{', closed' if self._closed else ''}>"


class AsyncSqsTransport(AsyncShell):
    """The asyncio twin of :class:`SqsTransport` (an aiobotocore client).  Build it with
    ``await AsyncSqsTransport.create(url, ...)``, which takes the same arguments."""

    _check_publish = staticmethod(check_publish)
    _check_claim = staticmethod(check_claim)
    _check_delay = staticmethod(check_sqs_delay)

    def __init__(self, client: Any, url: str, queue_url: str, wait_seconds: int) -> None:
        # Use create(); __init__ only stores what create() prepared.
        self._client, self.url, self.queue_url, self._wait = client, url, queue_url, wait_seconds
        self._core, self._clock = SqsCore(), default_clock

    @classmethod
    async def create(cls, url: str, *, prefix: str = "harel", region: str = "us-east-1",
                     client_options: Mapping[str, Any] | None = None, wait_seconds: int = 0,
                     timeout: float = 10.0) -> AsyncSqsTransport:
        from aiobotocore.config import AioConfig

        name, wait = queue_name(prefix), _check_wait(wait_seconds)
        arguments = _client_arguments(url, region, client_options)
        client = await _session().create_client("sqs", config=_config(timeout, wait, AioConfig), **arguments).__aenter__()
        try:
            with _errors(url, "open"):
                queue_url = (await client.create_queue(QueueName=name, Attributes=QUEUE_ATTRIBUTES))["QueueUrl"]
        except BaseException:
            await client.close()
            raise
        return cls(client, url, queue_url, wait)

    async def _perform(self, operation: str, step: Any) -> Any:
        with _errors(self.url, operation):
            try:
                return _answer(step, await _request(self._client, self.queue_url, self._wait, step))
            except Exception as exc:
                return _refused(step, exc)

    async def _release(self) -> None:
        await self._client.close()

    def __repr__(self) -> str:
        return f"<AsyncSqsTransport {self.queue_url}{', closed' if self._closed else ''}>"


@functools.cache
def _session() -> Any:
    """One aiobotocore session per process: a new one reads SQS's service model again (about
    0.2 s; boto3 keeps one of its own)."""
    from aiobotocore.session import get_session

    return get_session()


def _check_wait(wait_seconds: object) -> int:
    if isinstance(wait_seconds, bool) or not isinstance(wait_seconds, int) or not 0 <= wait_seconds <= 20:
        raise ValueError(f"wait_seconds must be a whole number of seconds from 0 to 20 (SQS's long polling), "
                         f"got {wait_seconds!r}")
    return wait_seconds
