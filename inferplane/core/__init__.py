"""The policy core: pure decisions (no I/O, no clock, no asyncio); `now` and RNG passed in."""
