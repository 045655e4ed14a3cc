"""Storage for the response caches: in-memory and Redis backends, and the embedding model.

The policy (what is cacheable, under which key, who may read it) is in
:mod:`inferplane.core.cache`; these modules only keep entries and turn text into vectors.
"""
