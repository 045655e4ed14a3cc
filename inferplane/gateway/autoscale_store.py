"""A file that keeps what the autoscaler learned across restarts of the gateway.

The loop learns, from loaded windows, how hot a pool's replicas may run within the SLO and how
long its bursts last (:mod:`inferplane.core.autoscale_knowledge`). A deploy restarts the
gateway; without a store the loop starts over at ``target_utilisation`` and pays again for
what it knew. With ``autoscale.state_path`` set, the controller reads the file at start and
rewrites it (atomically: a temporary file renamed over it) after a tick that changed what was
learned. A missing file is a first start; an unreadable or malformed one is logged and
ignored (the loop starts over rather than not at all).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import orjson

from inferplane.core.autoscale_knowledge import PoolKnowledge, as_json, parse

__all__ = ["LearnedStore"]

log = logging.getLogger("inferplane.gateway.autoscale")


class LearnedStore:
    """The learned values of every pool, in one JSON file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._saved: dict[str, PoolKnowledge] | None = None

    def load(self) -> dict[str, PoolKnowledge]:
        """What the file holds ({} when there is none or it cannot be read)."""
        try:
            learned = parse(orjson.loads(self.path.read_bytes()))
        except FileNotFoundError:
            learned = {}
        except (OSError, ValueError) as exc:  # orjson.JSONDecodeError is a ValueError
            log.warning("autoscale: ignoring learned values in %s: %s", self.path, exc)
            learned = {}
        self._saved = learned
        return learned

    def save(self, learned: Mapping[str, PoolKnowledge]) -> bool:
        """Write ``learned`` when it differs from what the file holds; whether it wrote."""
        now = dict(learned)
        if now == self._saved:
            return False
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(orjson.dumps(as_json(now), option=orjson.OPT_INDENT_2))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("autoscale: cannot keep learned values in %s: %s", self.path, exc)
            return False
        self._saved = now
        return True
