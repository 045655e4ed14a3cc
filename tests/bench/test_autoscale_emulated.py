"""The emulated autoscaling bench's load driver reaches the gateway with every call it has
open: a cap on the client's connections would queue calls in the driver, where no engine and
no scaling rule sees them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from autoscale_emulated import client_session


async def test_the_driver_does_not_cap_its_connections() -> None:
    session = client_session(120.0)
    try:
        assert session.connector is not None
        assert session.connector.limit == 0  # aiohttp's default is 100
        assert session.timeout.total == 120.0
    finally:
        await session.close()
