"""Fleet-wide demand for the autoscaler: every gateway process's counters, summed in Redis.

A gateway process sees only the calls that came to it: with N replicas of W workers each,
a loop sized from its own counters asks for about 1/(N W) of what the pool needs, and
``max()`` over the published desired replicas does not undo that. So when the shared state
is Redis, each process publishes its pool counters (cumulative work served, calls answered
200, calls finished, and its calls in flight) under its own id and reads back the sum over
every live process, in one script: every process then sizes from the same fleet-wide
demand and publishes (about) the same desired replicas.

Publishing cumulative values under the process's id makes the exchange idempotent (a retry
after a timeout counts nothing twice). A process that stops publishing for ``ttl_s`` (seen
by the server's clock) is retired: its counters move into the pool's retired totals, so the
fleet's counters never fall when a gateway pod goes away, and its calls in flight stop
counting. When Redis does not answer, the caller falls back on its own counters
(:class:`~inferplane.gateway.autoscale.AutoscaleController` reports ``demand: local``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import NamedTuple

from prometheus_client import CollectorRegistry

from inferplane.core.types import EndpointState, EndpointView
from inferplane.state.resp import ReplyError, RespClient, Script

__all__ = ["EXCHANGE_ERRORS", "PoolCounts", "SharedDemand", "pool_views", "registry_counts"]

#: What :meth:`SharedDemand.exchange` raises when Redis is away, slow or answers nonsense.
EXCHANGE_ERRORS = (OSError, TimeoutError, ReplyError, ValueError, TypeError)


class PoolCounts(NamedTuple):
    """One pool's counters: work served (tokens), calls answered 200, calls finished (all
    cumulative), and the gateway's calls in flight at its endpoints now."""

    tokens: float
    ok: float
    total: float
    in_flight: float


# KEYS[1]: live processes (id -> "tokens ok total in_flight expiry"), KEYS[2]: retired
# totals (t, o, n). ARGV: id, tokens, ok, total, in_flight, ttl_s, key ttl in ms.
_EXCHANGE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
local expiry = string.format('%.17g', now + tonumber(ARGV[6]))
local row = table.concat({ARGV[2], ARGV[3], ARGV[4], ARGV[5], expiry}, ' ')
redis.call('HSET', KEYS[1], ARGV[1], row)
local sum = {0, 0, 0, 0}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local s, v = {}, {}
  for part in string.gmatch(all[i + 1], '%S+') do s[#s + 1], v[#v + 1] = part, tonumber(part) end
  if v[5] <= now then
    redis.call('HINCRBYFLOAT', KEYS[2], 't', s[1])
    redis.call('HINCRBYFLOAT', KEYS[2], 'o', s[2])
    redis.call('HINCRBYFLOAT', KEYS[2], 'n', s[3])
    redis.call('HDEL', KEYS[1], all[i])
  else
    for j = 1, 4 do sum[j] = sum[j] + v[j] end
  end
end
local retired = redis.call('HMGET', KEYS[2], 't', 'o', 'n')
for j = 1, 3 do sum[j] = sum[j] + (tonumber(retired[j]) or 0) end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
for j = 1, 4 do sum[j] = string.format('%.17g', sum[j]) end
return sum
"""
_EXCHANGE_SCRIPT = Script(_EXCHANGE)

#: A pool's keys outlive the last process that published by this much (then its counters
#: start again from zero, which reads as one quiet window).
KEY_TTL_S = 86_400.0


class SharedDemand:
    """This process's side of the exchange (one Redis connection of its own)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "inferplane:",
        ttl_s: float = 30.0,
        op_timeout_s: float = 0.25,
        process_id: str | None = None,
    ) -> None:
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.process_id = uuid.uuid4().hex if process_id is None else process_id
        self._conn = RespClient(url, op_timeout_s=op_timeout_s)

    async def exchange(self, local: Mapping[str, PoolCounts]) -> dict[str, PoolCounts]:
        """Publish this process's counters per pool; the sums over every live process (and
        the retired ones). Raises what the connection raises when Redis does not answer."""
        out: dict[str, PoolCounts] = {}
        for pool, c in local.items():
            key = f"{self.prefix}autoscale:{pool}"
            reply = await self._conn.run_script(
                _EXCHANGE_SCRIPT,
                [f"{key}:live", f"{key}:retired"],
                [self.process_id, *(repr(float(v)) for v in c), repr(self.ttl_s),
                 int(KEY_TTL_S * 1000)],
            )  # fmt: skip
            out[pool] = PoolCounts(*(float(v) for v in reply))
        return out

    async def close(self) -> None:
        await self._conn.close()


def registry_counts(registry: CollectorRegistry) -> dict[str, tuple[float, float, float]]:
    """Per model: work served (prompt tokens not from cache, plus completion tokens), calls
    that succeeded, calls finished."""
    out: dict[str, list[float]] = {}
    for metric in registry.collect():
        if metric.name not in ("inferplane_tokens", "inferplane_requests"):
            continue
        for sample in metric.samples:
            if not sample.name.endswith("_total"):
                continue
            row = out.setdefault(sample.labels.get("model", ""), [0.0, 0.0, 0.0])
            if metric.name == "inferplane_tokens":
                kind = sample.labels.get("kind")
                if kind in ("prompt", "completion"):
                    row[0] += sample.value
                elif kind == "cached":  # a cached prefix costs the engine next to nothing
                    row[0] -= sample.value
            else:
                row[2] += sample.value
                row[1] += sample.value if sample.labels.get("status") == "200" else 0.0
    return {m: (r[0], r[1], r[2]) for m, r in out.items()}


def pool_views(
    views: list[EndpointView], pool: str
) -> tuple[dict[str, int], dict[str, int], int, int]:
    """The pool's endpoints: ready and warming ones by GPU, engine waiting calls and the
    gateway's calls in flight there."""
    serving: dict[str, int] = {}
    starting: dict[str, int] = {}
    waiting = in_flight = 0
    for v in views:
        if not v.serves(pool):
            continue
        waiting += v.load.num_waiting
        in_flight += v.in_flight
        if v.state is EndpointState.READY:
            serving[v.info.gpu] = serving.get(v.info.gpu, 0) + 1
        elif v.state is EndpointState.WARMING:
            starting[v.info.gpu] = starting.get(v.info.gpu, 0) + 1
    return serving, starting, waiting, in_flight
