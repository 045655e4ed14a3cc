"""Where the autoscaler keeps what it learned across restarts of the gateway: a file or Redis.

The loop learns, from loaded windows, how hot a pool's replicas may run within the SLO and how
long its bursts last (:mod:`inferplane.core.autoscale_knowledge`). A deploy restarts the
gateway; without a store the loop starts over at ``target_utilisation`` and pays again for
what it knew. ``autoscale.learned_store`` picks the store; the controller loads it at start
(:meth:`~inferplane.gateway.autoscale.AutoscaleController.restore`) and saves after a tick
that changed what was learned:

* ``file`` (``autoscale.state_path``): durable (a temporary file flushed to disk, renamed over
  the old one, the directory flushed: a crash leaves the old file or the new one), merged
  (rows of pools this run does not size are kept); one writer per file;
* ``redis`` (the ``state`` section's Redis): one hash per fleet, a field per pool, so gateway
  processes and pods share it and a pod replaced by a deploy finds it; each process sizes
  from the same fleet-wide demand (:mod:`inferplane.gateway.autoscale_demand`) and learns
  about the same values, the last write wins.

Either way, values saved more than ``MAX_AGE_S`` ago (by the wall clock) describe a fleet and
a workload that may be gone, and are ignored; a missing store is a first start; an
unreadable, malformed or stale one is logged and ignored (the loop starts over rather than
not at all), and a failed write is logged once until a write succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from inferplane.core.autoscale_knowledge import PoolKnowledge, as_json, parse
from inferplane.state.resp import ReplyError, RespClient

__all__ = ["MAX_AGE_S", "FileLearnedStore", "LearnedStore", "RedisLearnedStore"]

log = logging.getLogger("inferplane.gateway.autoscale")

#: Learned values older than this (a week) are not trusted.
MAX_AGE_S = 7 * 86_400.0
#: What a store's read or write raises when its file or Redis fails (a read also ValueError).
_STORE_ERRORS = (OSError, TimeoutError, ReplyError)


class LearnedStore:
    """What every store does: load, tell a change, save a change (logging failures)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._saved: dict[str, PoolKnowledge] = {}
        self._failing = False

    async def load(self) -> dict[str, PoolKnowledge]:
        """The values held ({} when there are none, or they are unreadable or stale)."""
        try:
            self._saved = await self._read()
        except (*_STORE_ERRORS, ValueError) as exc:
            log.warning("autoscale: ignoring learned values in %s: %s", self.where, exc)
            self._saved = {}
        return dict(self._saved)

    def changed(self, learned: Mapping[str, PoolKnowledge]) -> bool:
        """Whether ``learned`` differs from what the store holds for those pools."""
        return any(self._saved.get(pool) != k for pool, k in learned.items())

    async def save(self, learned: Mapping[str, PoolKnowledge]) -> bool:
        """Write the rows ``learned`` changes (other pools' rows stay); whether it wrote."""
        if not self.changed(learned):
            return False
        rows = {**self._saved, **learned}
        try:
            await self._write(rows, time.time())
        except _STORE_ERRORS as exc:
            if not self._failing:
                log.warning("autoscale: cannot keep learned values in %s: %s", self.where, exc)
            self._failing = True
            return False
        self._saved, self._failing = rows, False
        return True

    async def close(self) -> None:
        return None

    async def _read(self) -> dict[str, PoolKnowledge]:
        raise NotImplementedError

    async def _write(self, rows: dict[str, PoolKnowledge], now_unix: float) -> None:
        raise NotImplementedError


def _fresh(saved_at_unix: Any, now_unix: float) -> None:
    if not isinstance(saved_at_unix, float):
        raise ValueError("no saved_at_unix time")
    if now_unix - saved_at_unix > MAX_AGE_S:
        days = (now_unix - saved_at_unix) / 86_400
        raise ValueError(f"saved {days:.1f} days ago (at most {MAX_AGE_S / 86_400:.0f} trusted)")


class FileLearnedStore(LearnedStore):
    """Every pool's values in one JSON file: ``{"saved_at_unix": t, "pools": {...}}``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(str(path))
        self.path = Path(path)

    async def _read(self) -> dict[str, PoolKnowledge]:
        return await asyncio.to_thread(self._read_file)

    def _read_file(self) -> dict[str, PoolKnowledge]:
        try:
            doc = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        if not isinstance(doc, dict):
            raise ValueError("expected {'saved_at_unix': <seconds>, 'pools': {...}}")
        _fresh(doc.get("saved_at_unix"), time.time())
        return parse(doc.get("pools"))

    async def _write(self, rows: dict[str, PoolKnowledge], now_unix: float) -> None:
        doc = orjson.dumps({"saved_at_unix": now_unix, "pools": as_json(rows)},
                           option=orjson.OPT_INDENT_2)  # fmt: skip
        await asyncio.to_thread(self._write_file, doc)

    def _write_file(self, doc: bytes) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(doc)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class RedisLearnedStore(LearnedStore):
    """A hash ``<prefix>autoscale:learned``: per pool, its values and ``saved_at_unix``."""

    def __init__(self, url: str, *, prefix: str = "inferplane:", op_timeout_s: float = 0.25):
        self.key = f"{prefix}autoscale:learned"
        super().__init__(f"redis {self.key}")
        self._conn = RespClient(url, op_timeout_s=op_timeout_s)

    async def _read(self) -> dict[str, PoolKnowledge]:
        reply = await self._conn.execute("HGETALL", self.key)
        now, rows = time.time(), {}
        for field, value in zip(reply[::2], reply[1::2], strict=True):
            pool = field.decode() if isinstance(field, bytes) else str(field)
            row = orjson.loads(value)
            if not isinstance(row, dict):
                raise ValueError(f"pool {pool!r}: expected an object")
            try:
                _fresh(row.pop("saved_at_unix", None), now)
            except ValueError as exc:
                log.warning("autoscale: ignoring learned values of %r in %s: %s", pool,
                            self.where, exc)  # fmt: skip
                continue
            rows[pool] = row
        return parse(rows)

    async def _write(self, rows: dict[str, PoolKnowledge], now_unix: float) -> None:
        changed = {p: k for p, k in rows.items() if self._saved.get(p) != k}
        args: list[str | bytes] = []
        for pool, row in as_json(changed).items():
            args += [pool, orjson.dumps({**row, "saved_at_unix": now_unix})]
        if args:
            await self._conn.execute("HSET", self.key, *args)

    async def close(self) -> None:
        await self._conn.close()
