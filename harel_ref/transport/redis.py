"""RedisTransport: the queue in Redis, every operation one atomic Lua script, and its asyncio
twin (redis-py; the twin over ``redis.asyncio``).

**Keys** (``K`` is ``harel-ref:<prefix>``, prefix ``harel`` by default)::

    K:seq                    string  the last seq handed out (INCR)
    K:arrivals               string  the last arrival rank handed out (INCR)
    K:q:<group>              list    the group's messages, oldest first: "<seq>\\n<event>"
    K:g:<group>              hash    priority, key (routing key, if any), stamp (last_claimed_at),
                                     arrival, and while held: holder (token or '__parked__'),
                                     ends (end of the lease or park), leased (the seq leased)
    K:free:<priority>        zset    the free groups of that priority, in claim order
    K:free:<priority>:k:<key>  zset  the same, for the groups with routing key <key>
    K:held                   zset    held groups, scored by the end of their lease or park

A free set scores a group by its fairness stamp; its member is the arrival rank, zero-padded
to 20 digits, followed by the group id, so that equal stamps fall back to arrival order (R4)
in the set's own order.  A claim reads the first member of one set per priority level at or
above ``min_priority`` (and per routing key), and takes the earliest.

**Lapses.**  A lease or park that lapses writes nothing.  Each claim first *promotes* the held
groups whose end is ``< now`` into the free sets (each lapse is moved once); their hash keeps
the holder, so a lapsed lease nobody re-claimed still acks (R10).  A group promoted before the
clock stepped back whose lease is live again (R3) is moved back to ``K:held`` when a claim
meets it.

**Fairness is stamped on ack** (SPEC R5 ``"ack"``, as upstream): a successful ack that leaves
messages stamps the group with ``now``; claims and nacks do not.  ``now`` is always an argument
from the injected clock: the scripts never read the server's ``TIME``.

**Fencing** (R10): ack and nack act only when the hash's holder is the lease's token and
``leased`` its seq.

**A Redis restart.**  Without persistence (``appendonly no`` and no snapshots) a restart
empties the queue: every message, group, lease and stamp is gone, and an ack or nack of a
lease taken before it answers False.  With the append-only file (``appendonly yes``), a clean
restart (SIGTERM) finds everything again; a crash (SIGKILL, power loss) loses what was written
in the last second under ``appendfsync everysec`` (Redis's default), or nothing under
``appendfsync always``.  The transport cannot tell the difference: pick the persistence your
queue needs.  ``tests/test_redis.py`` restarts a server both ways.

**Errors** (R17): a server that cannot be reached raises :class:`StorageError` (nothing was
sent); a connection lost or a timeout during a call raises :class:`OutcomeUnknownError`.
redis-py's automatic retries are turned off: a script retried after its answer was lost
could publish twice or leave a lease nobody holds, while reporting success.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from ._base import (
    PARKED,
    ClockError,
    Clock,
    Lease,
    OutcomeUnknownError,
    StorageError,
    check_clock,
    default_clock,
    without_password,
)
from ._shell import AsyncShell, Shell, Steps, T, run_steps, run_steps_async

__all__ = ["AsyncRedisTransport", "RedisTransport", "key_prefix"]

_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")


def key_prefix(prefix: str | None = None) -> str:
    """``harel-ref:<prefix>`` (``harel`` when None): the start of every key of one queue."""
    if prefix is None:
        return "harel-ref:harel"
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str or None, got {type(prefix).__name__}: {prefix!r:.80}")
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"prefix must be a letter or '_' followed by at most 40 letters, digits or '_' "
            f"(it becomes part of key names), got {prefix!r:.80}"
        )
    return f"harel-ref:{prefix}"


# --- The scripts ----------------------------------------------------------------------------
# Every script gets the key prefix as ARGV[1] (they touch keys named after groups, so they
# cannot declare all their keys up front: this transport is for one Redis, not a cluster).

_COMMON = r"""
local K = ARGV[1]
local function member(h, group) return string.format('%020d', tonumber(h.arrival)) .. group end
local function hash(group)
  local flat = redis.call('HGETALL', K .. ':g:' .. group)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h
end
local function free_sets(h)
  local sets = {K .. ':free:' .. h.priority}
  if h.key then sets[2] = K .. ':free:' .. h.priority .. ':k:' .. h.key end
  return sets
end
local function set_free(group, h)  -- into the free sets, scored by its stamp
  for _, set in ipairs(free_sets(h)) do redis.call('ZADD', set, h.stamp, member(h, group)) end
  redis.call('ZREM', K .. ':held', group)
end
local function set_held(group, h, untill)  -- out of the free sets, into held until `untill`
  for _, set in ipairs(free_sets(h)) do redis.call('ZREM', set, member(h, group)) end
  redis.call('ZADD', K .. ':held', untill, group)
end
"""

PUBLISH = _COMMON + r"""
-- ARGV: K, group, event, priority, routing key ('' for none)
local group, event = ARGV[2], ARGV[3]
-- Integers are formatted with %d: Lua's tostring would write 1e+14 from 10^14 on.
local seq = string.format('%d', redis.call('INCR', K .. ':seq'))
redis.call('RPUSH', K .. ':q:' .. group, seq .. '\n' .. event)
if redis.call('EXISTS', K .. ':g:' .. group) == 0 then  -- a new group (R11, R12)
  local h = {priority = ARGV[4], stamp = '0', arrival = string.format('%d', redis.call('INCR', K .. ':arrivals'))}
  if ARGV[5] ~= '' then h.key = ARGV[5] end
  redis.call('HSET', K .. ':g:' .. group, 'priority', h.priority, 'stamp', h.stamp, 'arrival', h.arrival)
  if h.key then redis.call('HSET', K .. ':g:' .. group, 'key', h.key) end
  set_free(group, h)
end
return tonumber(seq)
"""

CLAIM = _COMMON + r"""
-- ARGV: K, now, until, token, min_priority, routing keys...
local now, untill, token, min_priority = tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5])
-- Promote the groups whose lease or park lapsed (end < now) into the free sets.
for _, group in ipairs(redis.call('ZRANGEBYSCORE', K .. ':held', '-inf', '(' .. ARGV[2])) do
  set_free(group, hash(group))
end
local sets = {}
for priority = min_priority, 4 do
  if #ARGV == 5 then
    sets[#sets + 1] = K .. ':free:' .. priority
  else
    for i = 6, #ARGV do sets[#sets + 1] = K .. ':free:' .. priority .. ':k:' .. ARGV[i] end
  end
end
while true do
  local best, best_score, best_member = nil, nil, nil
  for _, set in ipairs(sets) do
    local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
    if first[1] then
      local score = tonumber(first[2])
      if best == nil or score < best_score or (score == best_score and first[1] < best_member) then
        best, best_score, best_member = set, score, first[1]
      end
    end
  end
  if best == nil then return false end
  local group = string.sub(best_member, 21)
  local h = hash(group)
  if h.holder and tonumber(h.ends) >= now then
    set_held(group, h, h.ends)  -- promoted, then the clock stepped back: live again (R3)
  else
    local head = redis.call('LINDEX', K .. ':q:' .. group, 0)
    local cut = string.find(head, '\n', 1, true)
    local seq = string.sub(head, 1, cut - 1)
    redis.call('HSET', K .. ':g:' .. group, 'holder', token, 'ends', untill, 'leased', seq)
    set_held(group, h, untill)
    return {tonumber(seq), group, string.sub(head, cut + 1)}
  end
end
"""

ACK = _COMMON + r"""
-- ARGV: K, group, seq, token, now
local group = ARGV[2]
local h = hash(group)
if h.holder ~= ARGV[4] or h.leased ~= ARGV[3] then return 0 end  -- not this lease (R10)
redis.call('LPOP', K .. ':q:' .. group)
if redis.call('LLEN', K .. ':q:' .. group) == 0 then  -- its last message: the group is gone (R11)
  for _, set in ipairs(free_sets(h)) do redis.call('ZREM', set, member(h, group)) end
  redis.call('ZREM', K .. ':held', group)
  redis.call('DEL', K .. ':g:' .. group)
  return 1
end
for _, set in ipairs(free_sets(h)) do redis.call('ZREM', set, member(h, group)) end
redis.call('HDEL', K .. ':g:' .. group, 'holder', 'ends', 'leased')
h.stamp = ARGV[5]  -- fairness stamped on ack (R5)
redis.call('HSET', K .. ':g:' .. group, 'stamp', h.stamp)
set_free(group, h)
return 1
"""

NACK = _COMMON + r"""
-- ARGV: K, group, seq, token, now, delay, now + delay (summed in Python: Lua's tostring
-- would round the end to 14 digits, and a park must end exactly at now + delay, R9)
local group, delay = ARGV[2], tonumber(ARGV[6])
local h = hash(group)
if h.holder ~= ARGV[4] or h.leased ~= ARGV[3] then return 0 end  -- not this lease (R10)
if delay == 0 then  -- free again, its stamp unchanged (R8)
  redis.call('HDEL', K .. ':g:' .. group, 'holder', 'ends', 'leased')
  set_free(group, h)
else  -- parked until now + delay (R9)
  local untill = ARGV[7]
  redis.call('HSET', K .. ':g:' .. group, 'holder', '__parked__', 'ends', untill)
  redis.call('HDEL', K .. ':g:' .. group, 'leased')
  set_held(group, h, untill)
end
return 1
"""

assert PARKED == "__parked__"  # spelled out in NACK

# --- Arguments and answers, shared by the sync and async transports -------------------------


def _utf8(text: str) -> bytes:
    return text.encode("utf-8")


def _number(value: float) -> str:
    """A float as Lua's tonumber reads it back exactly (repr round-trips)."""
    return repr(float(value))


def publish_args(k: str, group_id: str, event: str, priority: int, routing_key: str | None) -> list[Any]:
    return [k, _utf8(group_id), _utf8(event), priority, b"" if routing_key is None else _utf8(routing_key)]


def claim_args(k: str, token: str, now: float, visibility: float, min_priority: int,
               routing_keys: tuple[str, ...] | None) -> list[Any]:
    return [k, _number(now), _number(now + visibility), _utf8(token), min_priority,
            *(_utf8(key) for key in routing_keys or ())]


def claimed(answer: Any, token: str) -> Lease | None:
    if not answer:
        return None
    seq, group_id, event = answer
    return Lease(group_id.decode("utf-8"), event.decode("utf-8"), int(seq), token)


def ack_args(k: str, lease: Lease, now: float) -> list[Any]:
    return [k, _utf8(lease.group_id), str(lease.seq), _utf8(lease.token), _number(now)]


def nack_args(k: str, lease: Lease, now: float, delay: float) -> list[Any]:
    return [k, _utf8(lease.group_id), str(lease.seq), _utf8(lease.token), _number(now), _number(delay),
            _number(now + delay)]


class Script(NamedTuple):
    """One step: run the Lua script ``name`` with ``args`` (a script is atomic in Redis)."""

    name: str
    args: list[Any]


SCRIPTS = {"publish": PUBLISH, "claim": CLAIM, "ack": ACK, "nack": NACK}


class RedisCore:
    """The four operations as steps (:mod:`harel_ref.transport._shell`): one script each."""

    def __init__(self, k: str) -> None:
        self.k = k

    def publish(self, group_id: str, event: str, priority: int, routing_key: str | None) -> Steps[None]:
        yield Script("publish", publish_args(self.k, group_id, event, priority, routing_key))

    def claim(self, token: str, now: float, visibility: float, min_priority: int,
              routing_keys: tuple[str, ...] | None) -> Steps[Lease | None]:
        return claimed((yield Script("claim", claim_args(self.k, token, now, visibility, min_priority, routing_keys))), token)

    def ack(self, lease: Lease, now: float) -> Steps[bool]:
        return bool((yield Script("ack", ack_args(self.k, lease, now))))

    def nack(self, lease: Lease, now: float, delay: float) -> Steps[bool]:
        return bool((yield Script("nack", nack_args(self.k, lease, now, delay))))


# --- Errors ---------------------------------------------------------------------------------


@contextmanager
def _errors(url: str, operation: str) -> Iterator[None]:
    """redis-py's errors as R17 says."""
    import redis

    try:
        yield
    except (StorageError, ClockError, OutcomeUnknownError):
        raise
    except (redis.AuthenticationError, redis.BusyLoadingError) as exc:  # refused before running anything
        raise StorageError(f"{operation} on {without_password(url)} failed: {exc}") from exc
    except (redis.ConnectionError, redis.TimeoutError, redis.InvalidResponse) as exc:
        if "connecting to" in str(exc).lower():  # the connection was never made: nothing was sent
            raise StorageError(f"{operation} on {without_password(url)} failed: cannot connect ({exc}); is the server up?") from exc
        raise OutcomeUnknownError(
            f"{operation} on {without_password(url)}: the connection was lost during the call ({exc}); it may or may "
            "not have taken effect (SPEC R17)"
        ) from exc
    except redis.RedisError as exc:
        raise StorageError(f"{operation} on {without_password(url)} failed: {exc}") from exc




def _client_options(timeout: float) -> dict[str, Any]:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No automatic retries: see the module's docstring.
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": Retry(NoBackoff(), 0),
            "retry_on_timeout": False}


# --- The transports -------------------------------------------------------------------------


class RedisTransport(Shell):
    """The queue in Redis at ``url`` (``redis://host:port/db``).  Thread-safe (redis-py's
    connection pool).

    - ``clock``: the time source, read once per claim, ack and nack.
    - ``prefix``: keys are ``harel-ref:<prefix>:...`` (``harel-ref:harel:...`` by default).
    - ``timeout``: seconds a call may take before :class:`OutcomeUnknownError`.
    """

    def __init__(self, url: str, *, clock: Clock = default_clock, prefix: str | None = None,
                 timeout: float = 10.0) -> None:
        import redis

        self._k = key_prefix(prefix)
        self._core = RedisCore(self._k)
        self._clock = check_clock(clock)
        self.url = url
        self._client = redis.Redis.from_url(url, **_client_options(timeout))
        self._scripts = {name: self._client.register_script(lua) for name, lua in SCRIPTS.items()}
        try:
            with _errors(url, "open"):
                self._client.ping()
        except BaseException:
            self._client.close()
            raise

    def _drive(self, operation: str, steps: Steps[T]) -> T:
        with _errors(self.url, operation):
            return run_steps(steps, lambda script: self._scripts[script.name](args=script.args))

    def _release(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"<RedisTransport {without_password(self.url)} keys {self._k}:*{state}>"


class AsyncRedisTransport(AsyncShell):
    """The asyncio twin of :class:`RedisTransport` (``redis.asyncio``).  Build it with
    ``await AsyncRedisTransport.create(url, ...)``."""

    def __init__(self, client: Any, url: str, k: str, clock: Clock) -> None:
        # Use create(); __init__ only stores what create() prepared.
        self._client = client
        self.url = url
        self._k = k
        self._core = RedisCore(k)
        self._clock = clock
        self._scripts = {name: client.register_script(lua) for name, lua in SCRIPTS.items()}

    @classmethod
    async def create(cls, url: str, *, clock: Clock = default_clock, prefix: str | None = None,
                     timeout: float = 10.0) -> AsyncRedisTransport:
        import redis.asyncio

        k = key_prefix(prefix)
        clock = check_clock(clock)
        client = redis.asyncio.Redis.from_url(url, **_client_options(timeout))
        try:
            with _errors(url, "open"):
                await client.ping()
        except BaseException:
            await client.aclose()
            raise
        return cls(client, url, k, clock)

    async def _drive(self, operation: str, steps: Steps[T]) -> T:
        with _errors(self.url, operation):
            return await run_steps_async(steps, lambda script: self._scripts[script.name](args=script.args))

    async def _release(self) -> None:
        await self._client.aclose()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"<AsyncRedisTransport {without_password(self.url)} keys {self._k}:*{state}>"
