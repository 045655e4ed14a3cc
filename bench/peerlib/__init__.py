"""Helpers of the peer scoreboard (``bench/peers.py``): workloads, gateways, load, report.

Nothing here is part of inferplane and inferplane imports none of it. The pure parts
(``workloads``, ``stats``, ``report``) are unit-tested in ``tests/bench``.
"""
