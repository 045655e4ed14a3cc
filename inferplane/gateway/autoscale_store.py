"""A file that keeps what the autoscaler learned across restarts of the gateway.

The loop learns, from loaded windows, how hot a pool's replicas may run within the SLO and how
long its bursts last (:mod:`inferplane.core.autoscale_knowledge`). A deploy restarts the
gateway; without a store the loop starts over at ``target_utilisation`` and pays again for
what it knew. With ``autoscale.state_path`` set, the controller reads the file at start and
rewrites it after a tick that changed what was learned:

* durably: a temporary file, flushed to disk, renamed over the old one, and the directory
  flushed, so a crash leaves the old file or the new one, never a torn one;
* merged: rows of pools this run does not size (yet) are kept as they were;
* bounded in age: values saved more than ``MAX_AGE_S`` ago (by the wall clock) describe a
  fleet and a workload that may be gone, and are ignored;
* one writer per file: gateway processes that share a fleet each learn from the same
  fleet-wide demand, but give each its own path (or one process the path).

A missing file is a first start; an unreadable, malformed or stale one is logged and ignored
(the loop starts over rather than not at all). A failed write is logged once until a write
succeeds again; the loop goes on either way.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

import orjson

from inferplane.core.autoscale_knowledge import PoolKnowledge, as_json, parse

__all__ = ["MAX_AGE_S", "LearnedStore"]

log = logging.getLogger("inferplane.gateway.autoscale")

#: Learned values older than this (a week) are not trusted.
MAX_AGE_S = 7 * 86_400.0


class LearnedStore:
    """The learned values of every pool, in one JSON file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._saved: dict[str, PoolKnowledge] = {}
        self._failing = False

    def load(self) -> dict[str, PoolKnowledge]:
        """What the file holds ({} when there is none, or it is unreadable or stale)."""
        try:
            doc = orjson.loads(self.path.read_bytes())
            if not isinstance(doc, dict) or not isinstance(doc.get("saved_at_unix"), float):
                raise ValueError("expected {'saved_at_unix': <seconds>, 'pools': {...}}")
            age_s = time.time() - doc["saved_at_unix"]
            if age_s > MAX_AGE_S:
                raise ValueError(f"saved {age_s / 86_400:.1f} days ago (at most 7 trusted)")
            self._saved = parse(doc.get("pools"))
        except FileNotFoundError:
            self._saved = {}
        except (OSError, ValueError) as exc:  # orjson.JSONDecodeError is a ValueError
            log.warning("autoscale: ignoring learned values in %s: %s", self.path, exc)
            self._saved = {}
        return dict(self._saved)

    def changed(self, learned: Mapping[str, PoolKnowledge]) -> bool:
        """Whether ``learned`` differs from what the file holds for those pools."""
        return any(self._saved.get(pool) != k for pool, k in learned.items())

    def save(self, learned: Mapping[str, PoolKnowledge]) -> bool:
        """Write ``learned`` over the rows the file holds when it changes them; whether it
        wrote. Blocking (it flushes to disk): a body on an event loop runs it in a thread."""
        if not self.changed(learned):
            return False
        rows = {**self._saved, **learned}
        doc = {"saved_at_unix": time.time(), "pools": as_json(rows)}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _sync_dir(self.path.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if not self._failing:
                log.warning("autoscale: cannot keep learned values in %s: %s", self.path, exc)
            self._failing = True
            return False
        self._saved, self._failing = rows, False
        return True


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
