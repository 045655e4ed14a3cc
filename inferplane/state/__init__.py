"""Backends of the shared-state interface (:mod:`inferplane.core.state`).

``memory`` (embedded, the default), ``redis`` (shared by workers and replicas) and
``resilient`` (Redis with a local fallback while it is slow or down). ``build_store`` picks
one from a :class:`~inferplane.state.config.StateConfig`.
"""
