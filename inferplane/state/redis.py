"""The Redis state store: what gateway workers and replicas share, exactly.

Every read-modify-write is one Lua script, so it is atomic on the server and no two
replicas can both spend the last token of a bucket:

* buckets: one hash per bucket (level ``l`` at time ``t``), the take script checks every
  bucket of the call then takes from all of them (or none); the same rules as
  :func:`inferplane.core.state.decide_take`. An untouched bucket expires when it would be
  full again, so idle tenants cost no memory;
* the workflow ledger: one hash per workflow, updated by a delta script, expiring after its
  idle TTL;
* ejections: one hash of endpoint -> [until, reason]; reads drop the expired ones;
* approximate-routing records: one sorted set per endpoint, member = prefix-block key,
  score = expiry, capped at ``max_route_keys`` (the soonest to expire dropped first);
* the response cache: plain keys with an absolute expiry (``PXAT``).

Timeouts are short (tens of milliseconds on loopback or in-cluster) and there are no
client-side retries: a slow store must fail fast so the resilient wrapper serves locally.
Times are the caller's wall clock (replicas are NTP-synchronised; a skew of milliseconds
shifts a refill by as much, never the total admitted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from inferplane.core.state import (
    BucketLevel,
    BucketSpec,
    BucketTake,
    Ejection,
    StoreMode,
    TakeResult,
    WorkflowDelta,
    level_at,
    match_length,
)
from inferplane.core.workflows import WorkflowRecord

__all__ = ["RedisStore"]

_TAKE = """
local now = tonumber(ARGV[1])
local check = ARGV[2] == '1'
local levels, ats = {}, {}
for i = 1, #KEYS do
  local cap, rate = tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  local amount = tonumber(ARGV[3*i+2])
  local st = redis.call('HMGET', KEYS[i], 'l', 't')
  local level, at = cap, now
  if st[1] then
    at = tonumber(st[2])
    level = math.min(cap, tonumber(st[1]) + rate * math.max(0, now - at))
  end
  if check then
    local need = math.min(amount, cap)
    if level + 1e-9 < need then
      return {0, i - 1, string.format('%.17g', (need - level) / rate)}
    end
  end
  levels[i], ats[i] = level, math.max(at, now)
end
for i = 1, #KEYS do
  local cap, rate = tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  local level = math.min(cap, levels[i] - tonumber(ARGV[3*i+2]))
  redis.call('HSET', KEYS[i], 'l', string.format('%.17g', level),
             't', string.format('%.17g', ats[i]))
  redis.call('PEXPIRE', KEYS[i], math.ceil((cap / rate + 1) * 1000))
end
return {1, -1, '0'}
"""

_WORKFLOW = """
local k, now = KEYS[1], tonumber(ARGV[1])
if redis.call('EXISTS', k) == 0 then
  redis.call('HSET', k, 'tenant', ARGV[3], 'done', 0, 'max_step', 0, 'tokens', 0,
             'cost', 0, 'retries', 0, 'in_flight', 0, 'first', ARGV[1], 'last', ARGV[1])
end
if ARGV[4] ~= '' then redis.call('HSET', k, 'expected', ARGV[4]) end
local in_flight = tonumber(redis.call('HGET', k, 'in_flight')) + tonumber(ARGV[5])
redis.call('HSET', k, 'in_flight', math.max(0, in_flight))
if ARGV[6] ~= '' then
  local step = tonumber(ARGV[6])
  if step <= tonumber(redis.call('HGET', k, 'max_step')) then
    redis.call('HINCRBY', k, 'retries', 1)
  else
    redis.call('HSET', k, 'max_step', step)
  end
end
if tonumber(ARGV[7]) > 0 then redis.call('HINCRBY', k, 'tokens', ARGV[7]) end
if tonumber(ARGV[8]) > 0 then redis.call('HINCRBYFLOAT', k, 'cost', ARGV[8]) end
if tonumber(ARGV[9]) > 0 then redis.call('HINCRBY', k, 'done', ARGV[9]) end
if now > tonumber(redis.call('HGET', k, 'last')) then redis.call('HSET', k, 'last', ARGV[1]) end
redis.call('PEXPIRE', k, ARGV[2])
return redis.call('HGETALL', k)
"""

_EJECT = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local o = cjson.decode(old)
  if tonumber(o[1]) >= tonumber(ARGV[2]) then
    if ARGV[3] ~= '' then
      redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({o[1], ARGV[3]}))
    end
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({ARGV[2], ARGV[3]}))
return 1
"""

_EJECTIONS = """
local all = redis.call('HGETALL', KEYS[1])
local live, now = {}, tonumber(ARGV[1])
for i = 1, #all, 2 do
  if tonumber(cjson.decode(all[i + 1])[1]) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    live[#live + 1] = all[i]
    live[#live + 1] = all[i + 1]
  end
end
return live
"""


def _num(value: float) -> str:
    return repr(float(value))


class RedisStore:
    """Implements :class:`~inferplane.core.state.StateStore` on a Redis server."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "inferplane:",
        op_timeout_s: float = 0.05,
        connect_timeout_s: float | None = None,  # None: as op_timeout_s
        max_connections: int = 256,
        max_route_keys: int = 100_000,
    ) -> None:
        self.prefix = prefix
        self._max_route_keys = max_route_keys
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=op_timeout_s,
            socket_connect_timeout=op_timeout_s if connect_timeout_s is None else connect_timeout_s,
            retry=Retry(NoBackoff(), 0),
            max_connections=max_connections,
        )
        self._take = self.client.register_script(_TAKE)
        self._workflow = self.client.register_script(_WORKFLOW)
        self._eject = self.client.register_script(_EJECT)
        self._ejections = self.client.register_script(_EJECTIONS)

    @property
    def mode(self) -> StoreMode:
        return StoreMode.SHARED

    # ---- buckets -------------------------------------------------------------------------

    async def take(self, takes: Sequence[BucketTake], now: float) -> TakeResult:
        return await self._run_take(takes, now, check=True)

    async def charge(self, takes: Sequence[BucketTake], now: float) -> None:
        await self._run_take(takes, now, check=False)

    async def _run_take(
        self, takes: Sequence[BucketTake], now: float, *, check: bool
    ) -> TakeResult:
        if not takes:
            return TakeResult(True)
        keys = [self.prefix + "b:" + t.bucket.key for t in takes]
        args: list[str] = [_num(now), "1" if check else "0"]
        for t in takes:
            args += [_num(t.bucket.capacity), _num(t.bucket.refill_per_s), _num(t.amount)]
        admitted, index, wait = await self._take(keys=keys, args=args)
        if int(admitted) == 1:
            return TakeResult(True)
        return TakeResult(False, int(index), float(wait))

    async def bucket(self, spec: BucketSpec, now: float) -> float:
        level, at_s = await self.client.hmget(self.prefix + "b:" + spec.key, ["l", "t"])
        stored = None if level is None or at_s is None else BucketLevel(float(level), float(at_s))
        return level_at(spec, stored, now)

    # ---- workflows -----------------------------------------------------------------------

    async def workflow_update(
        self, workflow_id: str, delta: WorkflowDelta, now: float, ttl_s: float
    ) -> WorkflowRecord:
        args = [
            _num(now),
            str(max(1, int(ttl_s * 1000))),
            delta.tenant,
            "" if delta.steps_expected is None else str(delta.steps_expected),
            str(delta.in_flight),
            "" if delta.dispatched_step is None else str(delta.dispatched_step),
            str(delta.tokens),
            _num(delta.cost_usd),
            str(delta.steps_done),
        ]
        flat = await self._workflow(keys=[self.prefix + "wf:" + workflow_id], args=args)
        return _record(workflow_id, dict(zip(flat[::2], flat[1::2], strict=True)))

    async def workflow_put(self, record: WorkflowRecord, ttl_s: float) -> None:
        key = self.prefix + "wf:" + record.workflow_id
        fields: dict[str, str] = {
            "tenant": record.tenant,
            "done": str(record.steps_done),
            "max_step": str(record.max_step),
            "tokens": str(record.tokens),
            "cost": _num(record.cost_usd),
            "retries": str(record.retries_used),
            "in_flight": str(record.in_flight),
            "first": _num(record.first_seen_s),
            "last": _num(record.last_seen_s),
        }
        if record.steps_expected is not None:
            fields["expected"] = str(record.steps_expected)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
            pipe.pexpire(key, max(1, int(ttl_s * 1000)))
            await pipe.execute()

    async def workflow_get(self, workflow_id: str, now: float) -> WorkflowRecord | None:
        found = await self.client.hgetall(self.prefix + "wf:" + workflow_id)
        return _record(workflow_id, found) if found else None

    async def workflow_end(self, workflow_id: str) -> bool:
        return int(await self.client.delete(self.prefix + "wf:" + workflow_id)) > 0

    # ---- ejections -----------------------------------------------------------------------

    async def eject(self, ejection: Ejection) -> None:
        args = [ejection.endpoint, _num(ejection.until_s), ejection.reason]
        await self._eject(keys=[self.prefix + "ej"], args=args)

    async def ejections(self, now: float) -> Mapping[str, Ejection]:
        flat = await self._ejections(keys=[self.prefix + "ej"], args=[_num(now)])
        out: dict[str, Ejection] = {}
        for name, raw in zip(flat[::2], flat[1::2], strict=True):
            until, reason = orjson.loads(raw)
            endpoint = name.decode()
            out[endpoint] = Ejection(endpoint, float(until), str(reason))
        return out

    # ---- approximate routing -------------------------------------------------------------

    async def record_route(self, endpoint: str, keys: Sequence[int], expires_at_s: float) -> None:
        if not keys:
            return
        zkey = self.prefix + "rt:" + endpoint
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(zkey, {str(k): expires_at_s for k in keys}, gt=True)
            pipe.zremrangebyrank(zkey, 0, -(self._max_route_keys + 1))
            pipe.pexpireat(zkey, int(expires_at_s * 1000) + 1, gt=True)
            pipe.pexpireat(zkey, int(expires_at_s * 1000) + 1, nx=True)
            await pipe.execute()

    async def match_routes(
        self, keys: Sequence[int], endpoints: Sequence[str], now: float
    ) -> dict[str, int]:
        if not keys:
            return dict.fromkeys(endpoints, 0)
        members = [str(k) for k in keys]
        async with self.client.pipeline(transaction=False) as pipe:
            for name in endpoints:
                pipe.zmscore(self.prefix + "rt:" + name, members)
            scores: list[list[float | None]] = await pipe.execute()
        return {n: match_length(s, now) for n, s in zip(endpoints, scores, strict=True)}

    # ---- response cache ------------------------------------------------------------------

    async def cache_get(self, key: str, now: float) -> bytes | None:
        found = await self.client.get(self.prefix + "c:" + key)
        return found if isinstance(found, bytes) else None

    async def cache_put(self, key: str, value: bytes, expires_at_s: float) -> None:
        await self.client.set(self.prefix + "c:" + key, value, pxat=int(expires_at_s * 1000))

    # ---- lifecycle -----------------------------------------------------------------------

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self.client.aclose()

    async def clear(self) -> int:
        """Delete every key under this store's prefix (tests, ``inferplane`` tooling)."""
        n = 0
        async for key in self.client.scan_iter(match=self.prefix + "*", count=500):
            n += int(await self.client.delete(key))
        return n


def _record(workflow_id: str, raw: Mapping[Any, Any]) -> WorkflowRecord:
    f = {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
    expected = f.get("expected")
    return WorkflowRecord(
        workflow_id=workflow_id,
        tenant=f["tenant"].decode(),
        steps_done=int(f["done"]),
        steps_expected=None if expected is None else int(expected),
        max_step=int(f["max_step"]),
        tokens=int(f["tokens"]),
        cost_usd=float(f["cost"]),
        retries_used=int(f["retries"]),
        in_flight=int(f["in_flight"]),
        first_seen_s=float(f["first"]),
        last_seen_s=float(f["last"]),
    )
