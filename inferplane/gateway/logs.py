"""Structured logs for the live body: one JSON object per line on stderr.

Standard ``logging`` carries the records; fields passed with ``extra={...}`` become keys of
the JSON line. Only the shells log (the policy core never does). Prompt and completion text
are never put into records: a request's line carries its ids, tenant, endpoint, decisions,
timings, token counts and cost (``recorder``), not what was said.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

#: LogRecord attributes that are plumbing, not fields worth emitting.
_RESERVED = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: ts, level, logger, msg and the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str = "info") -> None:
    """Route inferplane's loggers to stderr as JSON lines (idempotent)."""
    root = logging.getLogger("inferplane")
    for handler in list(root.handlers):
        if getattr(handler, "_inferplane_json", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._inferplane_json = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
