"""The simulator: the same policy core and engine model, driven in virtual time.

``inferplane simulate scenario.yaml`` replays a fleet config, a workload and a fault scenario
through the core's routers and the clock-free engine model, leaping from one event to the
next instead of ticking, so an hour of a large fleet runs in minutes and the same seed always
gives the same result.
"""
