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

Commands go through :class:`~inferplane.state.resp.RespClient` (one pipelined connection, a
fraction of redis-py's CPU per call: the store is on every request's path). Timeouts are
short (tens of milliseconds on loopback or in-cluster) and there are no client-side
retries: a slow store must fail fast so the resilient wrapper serves locally.
Times are the caller's wall clock (replicas are NTP-synchronised; a skew of milliseconds
shifts a refill by as much, never the total admitted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

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
from inferplane.state.resp import RespClient, Script

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
return redis.call('HMGET', k, 'tenant', 'done', 'expected', 'max_step', 'tokens', 'cost',
                  'retries', 'in_flight', 'first', 'last')
"""
# the record's fields in the order of the HMGET above (the update script's reply)
_FIELDS = ("tenant", "done", "expected", "max_step", "tokens", "cost", "retries", "in_flight",
           "first", "last")  # fmt: skip

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


_TAKE_SCRIPT, _WORKFLOW_SCRIPT = Script(_TAKE), Script(_WORKFLOW)
_EJECT_SCRIPT, _EJECTIONS_SCRIPT = Script(_EJECT), Script(_EJECTIONS)


class RedisStore:
    """Implements :class:`~inferplane.core.state.StateStore` on a Redis server."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "inferplane:",
        op_timeout_s: float = 0.05,
        connect_timeout_s: float | None = None,  # None: as op_timeout_s
        max_route_keys: int = 100_000,
    ) -> None:
        self.prefix = prefix
        self._max_route_keys = max_route_keys
        self.conn = RespClient(url, op_timeout_s=op_timeout_s, connect_timeout_s=connect_timeout_s)

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
        prefix = self.prefix + "b:"
        keys = [prefix + t.bucket.key for t in takes]
        args: list[str | float] = [float(now), "1" if check else "0"]
        for t in takes:
            b = t.bucket
            args += [float(b.capacity), float(b.refill_per_s), float(t.amount)]
        admitted, index, wait = await self.conn.run_script(_TAKE_SCRIPT, keys, args)
        if admitted == 1:
            return TakeResult(True)
        return TakeResult(False, int(index), float(wait))

    async def bucket(self, spec: BucketSpec, now: float) -> float:
        level, at_s = await self.conn.execute("HMGET", self.prefix + "b:" + spec.key, "l", "t")
        stored = None if level is None or at_s is None else BucketLevel(float(level), float(at_s))
        return level_at(spec, stored, now)

    # ---- workflows -----------------------------------------------------------------------

    async def workflow_update(
        self, workflow_id: str, delta: WorkflowDelta, now: float, ttl_s: float
    ) -> WorkflowRecord:
        args: list[str | int] = [
            _num(now),
            max(1, int(ttl_s * 1000)),
            delta.tenant,
            "" if delta.steps_expected is None else delta.steps_expected,
            delta.in_flight,
            "" if delta.dispatched_step is None else delta.dispatched_step,
            delta.tokens,
            _num(delta.cost_usd),
            delta.steps_done,
        ]
        key = self.prefix + "wf:" + workflow_id
        return _record(workflow_id, await self.conn.run_script(_WORKFLOW_SCRIPT, [key], args))

    async def workflow_put(self, record: WorkflowRecord, ttl_s: float) -> None:
        key = self.prefix + "wf:" + record.workflow_id
        fields: list[str | int] = [
            "tenant", record.tenant, "done", record.steps_done, "max_step", record.max_step,
            "tokens", record.tokens, "cost", _num(record.cost_usd),
            "retries", record.retries_used, "in_flight", record.in_flight,
            "first", _num(record.first_seen_s), "last", _num(record.last_seen_s),
        ]  # fmt: skip
        if record.steps_expected is not None:
            fields += ["expected", record.steps_expected]
        ttl_ms = max(1, int(ttl_s * 1000))
        await self.conn.transaction(
            [("DEL", key), ("HSET", key, *fields), ("PEXPIRE", key, ttl_ms)]
        )

    async def workflow_get(self, workflow_id: str, now: float) -> WorkflowRecord | None:
        found = await self.conn.execute("HMGET", self.prefix + "wf:" + workflow_id, *_FIELDS)
        return None if found[0] is None else _record(workflow_id, found)

    async def workflow_end(self, workflow_id: str) -> bool:
        return int(await self.conn.execute("DEL", self.prefix + "wf:" + workflow_id)) > 0

    # ---- ejections -----------------------------------------------------------------------

    async def eject(self, ejection: Ejection) -> None:
        args = [ejection.endpoint, _num(ejection.until_s), ejection.reason]
        await self.conn.run_script(_EJECT_SCRIPT, [self.prefix + "ej"], args)

    async def ejections(self, now: float) -> Mapping[str, Ejection]:
        flat = await self.conn.run_script(_EJECTIONS_SCRIPT, [self.prefix + "ej"], [_num(now)])
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
        score = _num(expires_at_s)
        members: list[str | int] = []
        for k in keys:
            members += [score, k]
        at_ms = int(expires_at_s * 1000) + 1
        await self.conn.pipeline([
            ("ZADD", zkey, "GT", *members),
            ("ZREMRANGEBYRANK", zkey, 0, -(self._max_route_keys + 1)),
            ("PEXPIREAT", zkey, at_ms, "GT"),
            ("PEXPIREAT", zkey, at_ms, "NX"),
        ])  # fmt: skip

    async def match_routes(
        self, keys: Sequence[int], endpoints: Sequence[str], now: float
    ) -> dict[str, int]:
        if not keys or not endpoints:
            return dict.fromkeys(endpoints, 0)
        found = await self.conn.pipeline(
            [("ZMSCORE", self.prefix + "rt:" + name, *keys) for name in endpoints]
        )
        return {
            name: match_length([None if s is None else float(s) for s in scores], now)
            for name, scores in zip(endpoints, found, strict=True)
        }

    # ---- response cache ------------------------------------------------------------------

    async def cache_get(self, key: str, now: float) -> bytes | None:
        found = await self.conn.execute("GET", self.prefix + "c:" + key)
        return found if isinstance(found, bytes) else None

    async def cache_put(self, key: str, value: bytes, expires_at_s: float) -> None:
        at_ms = int(expires_at_s * 1000)
        await self.conn.execute("SET", self.prefix + "c:" + key, value, "PXAT", at_ms)

    # ---- lifecycle -----------------------------------------------------------------------

    async def ping(self) -> bool:
        return bool(await self.conn.execute("PING") == b"PONG")

    async def close(self) -> None:
        await self.conn.close()

    async def clear(self) -> int:
        """Delete every key under this store's prefix (tests, ``inferplane`` tooling)."""
        n, cursor = 0, b"0"
        while True:
            cursor, keys = await self.conn.execute(
                "SCAN", cursor, "MATCH", self.prefix + "*", "COUNT", 500
            )
            if keys:
                n += int(await self.conn.execute("DEL", *keys))
            if cursor == b"0":
                return n


def _record(workflow_id: str, values: Sequence[bytes | None]) -> WorkflowRecord:
    """A record from its fields' values in ``_FIELDS`` order (only ``expected`` may lack)."""
    f = dict(zip(_FIELDS, values, strict=True))

    def get(name: str) -> bytes:
        value = f[name]
        if value is None:
            raise ValueError(f"workflow record {workflow_id!r} in Redis lacks {name!r}")
        return value

    expected = f["expected"]
    return WorkflowRecord(
        workflow_id=workflow_id,
        tenant=get("tenant").decode(),
        steps_done=int(get("done")),
        steps_expected=None if expected is None else int(expected),
        max_step=int(get("max_step")),
        tokens=int(get("tokens")),
        cost_usd=float(get("cost")),
        retries_used=int(get("retries")),
        in_flight=int(get("in_flight")),
        first_seen_s=float(get("first")),
        last_seen_s=float(get("last")),
    )
