"""Per-tenant nearest-neighbour index of embedded questions: the semantic cache's lookup.

Each tenant has its own matrix of unit vectors; a query only ever scans its own tenant's
matrix, so no similarity, however high, can cross tenants. A row also carries the *context
hash* of its request (system prompt, model, sampling parameters) and only rows of the same
context can match. Exact cosine over a dense numpy matrix is one matrix-vector product, bound
by memory bandwidth (15 MB at 10,000 rows of 384 floats): ~0.6 ms p50 on one core of the
2-core dev machine (``bench/cache.py``; single-threaded on purpose). Past ~10^5-10^6 rows per
tenant an approximate index (HNSW, e.g. hnswlib or faiss, or Redis' vector search when shared
across replicas) would replace the scan.

The scan can run off the caller's thread (the gateway runs it in the embedding worker, right
after the embedding): :meth:`SemanticIndex.view` takes a read-only :class:`IndexView` of one
tenant and context, :meth:`IndexView.scan` is a pure function of it, and
:meth:`SemanticIndex.resolve` turns the scan's best row back into a key on the owner's thread.
If rows were added or replaced meanwhile (the tenant's version moved), the row is re-checked
against what it holds now (same context, similarity recomputed, threshold), so a key is never
served for a vector other than the one that passed.

Bounded: at most ``max_rows_per_tenant`` rows per tenant (a ring: the oldest row is replaced
first) and ``max_rows`` in all (the least recently used tenant is dropped first). Matrices
grow by doubling, so small tenants stay small. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]
_MIN_ROWS = 16


@dataclass(frozen=True, slots=True)
class Neighbour:
    """The best match of a query: the cache key it points at and its cosine similarity."""

    key: str
    similarity: float


def _context_id(context_hash: str) -> int:
    return int(context_hash[:15], 16)


@dataclass(frozen=True, slots=True)
class ScanHit:
    """The best row of a scan and its cosine similarity (not yet a key: see ``resolve``)."""

    row: int
    similarity: float


@dataclass(frozen=True, slots=True)
class IndexView:
    """One tenant's rows in one context as they were when taken; safe to scan in a thread."""

    tenant: str
    context: int
    version: int
    matrix: npt.NDArray[np.float32]
    contexts: npt.NDArray[np.int64]

    def scan(self, vector: Vector) -> ScanHit | None:
        """The most similar row of this context (any similarity), or None if it has none.

        Pure and GIL-free in its heavy part (numpy's einsum), so it can run in a worker.
        ``vector`` must be unit-length (the embedder's are).
        """
        # einsum, not BLAS: a matrix-vector product this size is memory-bound, and a threaded
        # BLAS spinning against a busy event loop is 10-20x slower than one plain loop.
        sims = np.einsum("ij,j->i", self.matrix, vector)
        sims[self.contexts != self.context] = -2.0
        best = int(np.argmax(sims))
        similarity = float(sims[best])
        return None if similarity < -1.5 else ScanHit(best, similarity)


class _TenantRows:
    __slots__ = ("contexts", "keys", "matrix", "next_row", "size", "version")

    def __init__(self, dim: int) -> None:
        self.matrix: npt.NDArray[np.float32] = np.zeros((_MIN_ROWS, dim), dtype=np.float32)
        self.contexts: npt.NDArray[np.int64] = np.zeros(_MIN_ROWS, dtype=np.int64)
        self.keys: list[str] = []
        self.size = 0
        self.next_row = 0
        self.version = 0  # the index's add count at this tenant's last add (see ``view``)

    def _grow(self, limit: int) -> None:
        rows = min(limit, 2 * len(self.matrix))
        matrix = np.zeros((rows, self.matrix.shape[1]), dtype=np.float32)
        matrix[: self.size] = self.matrix[: self.size]
        contexts = np.zeros(rows, dtype=np.int64)
        contexts[: self.size] = self.contexts[: self.size]
        self.matrix, self.contexts = matrix, contexts

    def add(self, vector: Vector, context: int, key: str, limit: int, version: int) -> int:
        """Store a row; returns how many rows were added (0 when one was replaced)."""
        if self.size < limit:
            if self.size == len(self.matrix):
                self._grow(limit)
            row = self.size
            self.size += 1
            self.keys.append(key)
            added = 1
        else:
            row = self.next_row
            self.next_row = (row + 1) % limit
            self.keys[row] = key
            added = 0
        self.version = version
        self.matrix[row] = vector
        self.contexts[row] = context
        return added


class SemanticIndex:
    """Unit vectors by tenant; cosine nearest neighbour within one tenant and context."""

    def __init__(self, dim: int, max_rows_per_tenant: int, max_rows: int) -> None:
        if dim < 1 or max_rows_per_tenant < 1 or max_rows < 1:
            raise ValueError("index dimensions and bounds must be positive")
        self.dim = dim
        self.max_rows_per_tenant = min(max_rows_per_tenant, max_rows)
        self.max_rows = max_rows
        self._tenants: OrderedDict[str, _TenantRows] = OrderedDict()
        self.num_rows = 0
        # Adds so far, index-wide: a tenant's version never repeats, even when the tenant is
        # dropped and comes back, so an unchanged version means unchanged rows.
        self._adds = 0

    def __len__(self) -> int:
        return self.num_rows

    def rows_of(self, tenant: str) -> int:
        rows = self._tenants.get(tenant)
        return 0 if rows is None else rows.size

    def _unit(self, vector: Vector) -> Vector:
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        if v.shape[0] != self.dim:
            raise ValueError(f"vector has {v.shape[0]} dimensions, index has {self.dim}")
        norm = float(np.linalg.norm(v))
        if not np.isfinite(norm) or norm == 0.0:
            raise ValueError("vector must be finite and non-zero")
        return v / norm

    def add(self, tenant: str, context_hash: str, vector: Vector, key: str) -> None:
        """Remember that ``vector`` (in this tenant and context) is answered by ``key``."""
        unit = self._unit(vector)
        rows = self._tenants.get(tenant)
        if rows is None:
            rows = self._tenants[tenant] = _TenantRows(self.dim)
        self._tenants.move_to_end(tenant)
        self._adds += 1
        context = _context_id(context_hash)
        self.num_rows += rows.add(unit, context, key, self.max_rows_per_tenant, self._adds)
        while self.num_rows > self.max_rows:
            _, dropped = self._tenants.popitem(last=False)
            self.num_rows -= dropped.size

    def nearest(
        self, tenant: str, context_hash: str, vector: Vector, threshold: float
    ) -> Neighbour | None:
        """The most similar row of this tenant and context at or above ``threshold``."""
        view = self.view(tenant, context_hash)
        if view is None:
            return None
        unit = self._unit(vector)
        return self.resolve(view, view.scan(unit), unit, threshold)

    def view(self, tenant: str, context_hash: str) -> IndexView | None:
        """A read-only view of this tenant's rows for a scan elsewhere; None: no rows."""
        rows = self._tenants.get(tenant)
        if rows is None or rows.size == 0:
            return None
        self._tenants.move_to_end(tenant)
        return IndexView(
            tenant, _context_id(context_hash), rows.version,
            rows.matrix[: rows.size], rows.contexts[: rows.size],
        )  # fmt: skip

    def resolve(
        self, view: IndexView, hit: ScanHit | None, vector: Vector, threshold: float
    ) -> Neighbour | None:
        """The key of a scan's best row if it passes ``threshold``; re-checked if it moved."""
        rows = self._tenants.get(view.tenant)
        if hit is None or rows is None or hit.row >= rows.size:
            return None
        similarity = hit.similarity
        if rows.version != view.version:  # rows added or replaced since the view: re-check
            if int(rows.contexts[hit.row]) != view.context:
                return None
            similarity = float(rows.matrix[hit.row] @ self._unit(vector))
        if similarity < threshold:
            return None
        return Neighbour(rows.keys[hit.row], min(1.0, similarity))

    def forget_tenant(self, tenant: str) -> None:
        rows = self._tenants.pop(tenant, None)
        if rows is not None:
            self.num_rows -= rows.size
