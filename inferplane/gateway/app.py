"""The gateway's HTTP application: the OpenAI-compatible front door of a configured fleet.

A call walks: authenticate and read the context headers (``context``), read and check the
body, answer from the response cache when it can (``response_cache``), pass admission
(``admission_gate``: admit, queue until dispatched, or refuse with Retry-After), resolve the
model name to served models and rank endpoints on the state of that moment (``planner``, late
binding), then hand the call to the proxy, which answers the client from the first endpoint
that responds. The recorder accounts for it afterwards, admission settles its quotas and a
clean answer is kept in the cache. Tracing, the dashboard, fleet metrics and autoscaling are
mounted by ``build_app``; shared state (quotas across workers) is built from ``state:``.
Every refusal is an OpenAI error JSON (the error middleware), never a traceback. Besides
generation: ``/v1/models``, ``/health`` (the process is alive), ``/ready`` (some endpoint can
take work), ``/metrics``, ``/v1/stats`` and ``POST /v1/workflows/{id}/end``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable

import aiohttp
import orjson
from aiohttp import web

from inferplane.config import FleetConfig
from inferplane.core.accounting import TaskOutcome
from inferplane.core.state import StateStore
from inferplane.core.types import CallContext, EndpointState, scoped_workflow_id
from inferplane.gateway.admission_gate import AdmissionGate
from inferplane.gateway.autoscale import setup_autoscaling
from inferplane.gateway.context import (
    ApiKind,
    Authenticator,
    RequestContext,
    parse_json_object,
    read_context,
)
from inferplane.gateway.dashboard import setup_dashboard
from inferplane.gateway.errors import ApiError, error_middleware
from inferplane.gateway.fleet_metrics import setup_fleet_metrics
from inferplane.gateway.metrics import CONTENT_TYPE
from inferplane.gateway.planner import admission_call, plan_call
from inferplane.gateway.proxy import Candidate, Exchange, Proxy
from inferplane.gateway.recorder import Recorder
from inferplane.gateway.response_cache import CacheLookup, ResponseCache, StreamCapture
from inferplane.gateway.router import GatewayRouter
from inferplane.gateway.server import FRONT_ROUTES, FrontRoutes, start_server, tune_gc
from inferplane.gateway.shared_ledger import setup_workflow_routes
from inferplane.gateway.stats import render_metrics, stats_body
from inferplane.gateway.tracing import GatewayTracer, TracingConfig, setup_tracing
from inferplane.gateway.tracker import EndpointTracker
from inferplane.gateway.upstream import UpstreamClient
from inferplane.state.config import StateBackend, build_store
from inferplane.state.quota_client import SharedQuotas

__all__ = ["Gateway", "start_server"]

log = logging.getLogger("inferplane.gateway")


class Gateway:
    """The live body for one fleet config. Components are built when the app starts."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._auth = Authenticator(config.gateway.auth)
        self.retries = config.gateway.retries_before_first_byte
        self._in_flight = 0
        self._models_body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "inferplane"}
                    for m in config.model_names()
                ],
            }
        )
        self.fallback = {r.name: r.allow_fallback for r in config.routes}
        self.targets = {m: config.targets_for(m) for m in config.model_names()}
        # Long-lived routing state: predictor, workflow affinity, prefix index, KV events.
        self.router = GatewayRouter(config, config.gateway.seed)
        self._call_ids = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self.clock: Callable[[], float] = _no_clock
        self.session: aiohttp.ClientSession | None = None
        self.tracker: EndpointTracker
        self.recorder: Recorder
        self.proxy: Proxy
        self.upstream: UpstreamClient
        self.gate: AdmissionGate
        self.cache: ResponseCache
        self.state: StateStore
        self.tracer = GatewayTracer(TracingConfig())  # off until build_app sets it up

    @property
    def in_flight(self) -> int:
        return self._in_flight

    # ---- lifecycle -------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[error_middleware(self._reject)],
            client_max_size=self.config.gateway.max_body_bytes,
        )
        app.router.add_post(ApiKind.CHAT, self._chat)
        app.router.add_post(ApiKind.COMPLETIONS, self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/stats", self._stats)
        app.router.add_post("/v1/workflows/{workflow_id}/end", self._end_workflow)
        # The generation routes are also answered by the lean front server (``server``),
        # which calls ``_generate`` itself (one coroutine less per call).
        hot = {p: functools.partial(self._generate, path=p) for p in ApiKind.ALL}
        app[FRONT_ROUTES] = FrontRoutes(hot, self.config.gateway.max_body_bytes)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        setup_dashboard(app)
        setup_fleet_metrics(app, self)
        self.tracer = setup_tracing(app, self.config.tracing)
        setup_autoscaling(app, self, self.config.autoscale)
        setup_workflow_routes(app, self)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        await self.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.stop()

    async def start(self) -> None:
        gw = self.config.gateway
        self.clock = asyncio.get_running_loop().time
        connector = aiohttp.TCPConnector(limit=gw.max_connections, limit_per_host=0)
        # No cookie jar (engines' cookies are not ours to keep; an empty jar still costs a
        # lookup per request), no User-Agent, and no Accept-Encoding: an engine on the local
        # network should not spend CPU compressing what the gateway would then decompress.
        self.session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        infos = [e.info() for e in self.config.endpoints]
        self.recorder = Recorder(
            infos,
            self.clock(),
            gw.workflow_idle_ttl_s,
            gw.log_requests,
            known_models=self.config.model_names(),
        )
        self.tracker = EndpointTracker(
            self.config.endpoints, gw, self.clock, self.recorder.on_endpoint_state
        )
        # Engine calls go over the lean keep-alive client; health checks and scrapes keep
        # aiohttp's session (a few per second, not per call).
        self.upstream = UpstreamClient(gw.max_connections)
        self.proxy = Proxy(
            self.upstream, self.tracker, gw.timeouts, self.retries, self.clock,
            reliability=self.config.reliability, predictor=self.router.predictor,
        )  # fmt: skip
        self.state = build_store(self.config.state)
        shared = None
        if self.config.state.backend is StateBackend.REDIS:
            shared = SharedQuotas(self.state, self.config.admission.quotas)
            self._tasks.append(asyncio.create_task(self._state_loop()))
        self.gate = AdmissionGate(
            self.config.admission, self.router.predictor, self.tracker.views, self.clock,
            self.recorder.metrics, shared, tracer=self.tracer,
        )  # fmt: skip
        self.cache = ResponseCache(self.config.cache, self.clock)
        await self.cache.warm()
        await self.tracker.start(self.session)
        self.router.start()
        self._tasks.append(asyncio.create_task(self._expire_loop()))
        self._tasks.append(asyncio.create_task(self.gate.run()))
        tune_gc()
        log.info("gateway started", extra={"endpoints": len(infos), "ready": self._num_ready()})

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.router.stop()
        if self.session is not None:
            self.gate.close()
            await self.tracker.stop()
            await self.upstream.close()
            await self.session.close()
            await self.cache.close()
            await self.state.close()
            self.session = None

    async def _expire_loop(self) -> None:
        period_s = min(5.0, self.config.gateway.workflow_idle_ttl_s / 4)
        while True:
            await asyncio.sleep(period_s)
            now = self.clock()
            self.recorder.accountant.expire(now)
            self.gate.core.expire_workflows(now)

    async def _state_loop(self) -> None:
        """Probe the shared store: back from degraded mode, replay the local journal."""
        period_s = self.config.state.probe_interval_s
        maintain = getattr(self.state, "maintain", None)
        while maintain is not None:
            await asyncio.sleep(period_s)
            try:
                await maintain(time.time())
            except Exception:  # the probe must outlive a bad round
                log.exception("shared state maintenance failed")

    def _num_ready(self) -> int:
        return sum(self.tracker.state(n) is EndpointState.READY for n in self.tracker.names())

    def _reject(self, status: int, code: str) -> None:
        """A call refused before its context was read (the error middleware's report)."""
        self.recorder.reject(None, status, code, self.clock())

    # ---- generation ------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, ApiKind.CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, ApiKind.COMPLETIONS)

    async def _generate(self, request: web.Request, path: str) -> web.StreamResponse:
        tracer, auth, limit = self.tracer, self._auth, self.config.gateway.max_body_bytes
        if tracer.enabled:  # authenticate and context as two hops; off: no hop at all
            ctx, raw, body = await tracer.read_context(request, path, auth, self.clock(), limit)
        else:
            ctx, raw, body = await read_context(request, path, auth, self.clock(), limit)
        with tracer.hop("cache") as span:
            found = await self.cache.lookup(ctx, body, request.headers)
            if tracer.enabled:  # off: no call on the shared no-op span
                span.set_attribute("inferplane.cache", found.status.value)
        if found.hit:
            return await self.cache.respond(request, found, ctx.request_id)
        admitted: CallContext | None = None
        try:
            if self._in_flight >= self.config.gateway.max_in_flight:
                raise ApiError(
                    429, "gateway is at its in-flight limit", code="gateway_overloaded",
                    headers={"Retry-After": "1"},
                )  # fmt: skip
            call = admission_call(self, ctx)
            with tracer.hop("admit"):  # the decision; a call that queues has a ``queue`` hop
                await self.gate.enter(call, ctx.api_key_name, len(raw))
            admitted = call
            candidates, calls, reason = plan_call(self, ctx, raw, body, call)
            if not candidates:
                raise ApiError(
                    503, f"no endpoint can take model '{ctx.model}' now ({reason})",
                    code="no_endpoint", headers={"Retry-After": "1"},
                )  # fmt: skip
        except ApiError as err:
            if admitted is not None:
                self.gate.leave(admitted, num_tokens=0, success=False)
            err.recorded = True
            err.headers["X-Request-Id"] = ctx.request_id
            self.recorder.reject(ctx, err.status, err.code or err.error_type, self.clock())
            raise
        return await self._proxy_call(request, ctx, candidates, calls, reason, found, call)

    async def _proxy_call(
        self,
        request: web.Request,
        ctx: RequestContext,
        candidates: list[Candidate],
        calls: dict[str, CallContext],
        reason: str,
        found: CacheLookup,
        admitted: CallContext,
    ) -> web.StreamResponse:
        router, key = self.router, str(next(self._call_ids))
        sent_at: list[float] = [ctx.arrival_s]
        capture = self.cache.capture(found) if ctx.stream else None
        ex = Exchange(
            on_first_token=lambda t: router.on_first_token(key, t - sent_at[0], t),
            tap=capture.feed if capture is not None else None,
            extra_headers=found.headers(),
            model_of={name: c.model for name, c in calls.items()},
            primary_model=self.targets[ctx.model][0],
        )
        cost: list[float] = []

        def finish(done: Exchange) -> float:
            if not cost:
                now = self.clock()
                with self.tracer.hop("account") as span:
                    cost.append(self.recorder.finish(ctx, done, reason, now))
                    if self.tracer.enabled:
                        self.tracer.note_account(span, done, cost[0])
                ok = done.completed and done.endpoint is not None
                usage = (done.prompt_tokens, done.cached_tokens) if ok else None
                router.on_finish(key, now, tpot_s=done.tpot_s(), usage=usage)
                if ok and done.endpoint is not None:
                    router.remember_workflow(ctx.workflow_id, done.endpoint, now)
                num_tokens = done.prompt_tokens + done.completion_tokens
                self.gate.leave(
                    admitted, num_tokens=num_tokens, cost_usd=cost[0], success=ok,
                    num_output_tokens=done.completion_tokens,
                )  # fmt: skip
            return cost[0]

        def on_attempt(endpoint: str, retry_reason: str | None) -> None:
            now = sent_at[0] = self.clock()
            if retry_reason is not None:
                self.recorder.on_retry(retry_reason)
            self.recorder.on_attempt(ctx, endpoint, now)
            view = self.tracker.view(endpoint, now)
            ex.dispatch_estimate = router.on_dispatch(key, calls[endpoint], view, now)

        self._in_flight += 1
        try:
            resp = await self.proxy.forward(request, ctx, candidates, ex, finish, on_attempt)
            if found.key is not None and ex.completed and ex.status == 200 and not ex.reason:
                await self._store(found, ex, resp, capture, finish(ex))
            return resp
        except ApiError as err:
            ex.status, ex.reason = err.status, ex.reason or err.code or err.error_type
            err.recorded = True
            err.headers["X-Request-Id"] = ctx.request_id
            if ex.endpoint:
                err.headers["X-Inferplane-Endpoint"] = ex.endpoint
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            ex.status, ex.reason = 499, "client_disconnected"
            raise
        finally:
            self._in_flight -= 1
            finish(ex)
            ex.on_first_token = None  # its scope holds ``ex``: no cycle left for the GC

    async def _store(
        self,
        found: CacheLookup,
        ex: Exchange,
        resp: web.StreamResponse,
        capture: StreamCapture | None,
        cost_usd: float,
    ) -> None:
        """Keep a clean answer for the next identical call."""
        saved = {"cost_usd": cost_usd, "completion_tokens": ex.completion_tokens}
        if capture is not None:
            await self.cache.store_stream(found, capture, **saved)
        elif isinstance(resp, web.Response) and isinstance(resp.body, bytes):
            await self.cache.store_json(found, resp.body, **saved)

    # ---- the rest of the API ---------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        self._auth.caller(request.headers)
        return web.Response(body=self._models_body, content_type="application/json")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(body=b'{"status":"ok"}', content_type="application/json")

    async def _ready(self, request: web.Request) -> web.Response:
        ready = self._num_ready()
        body = orjson.dumps({"ready": ready > 0, "ready_endpoints": ready})
        return web.Response(
            status=200 if ready else 503, body=body, content_type="application/json"
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        body = render_metrics(self)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _stats(self, request: web.Request) -> web.Response:
        self._auth.caller(request.headers)
        return web.Response(body=orjson.dumps(stats_body(self)), content_type="application/json")

    async def _end_workflow(self, request: web.Request) -> web.Response:
        tenant = self._auth.caller(request.headers).tenant
        workflow_id = request.match_info["workflow_id"]
        body = parse_json_object(await request.read())
        outcome = body.get("outcome")
        if outcome not in (TaskOutcome.SUCCESS.value, TaskOutcome.FAILURE.value):
            raise ApiError(400, "'outcome' must be 'success' or 'failure'", param="outcome")
        # The caller's own workflow only (another tenant's of the same id is another one);
        # admission's ledger (and the shared record) forget it too, not only the accountant.
        scoped = scoped_workflow_id(tenant, workflow_id)
        await self.gate.end_workflow(scoped)
        if not self.recorder.end_workflow(scoped, TaskOutcome(outcome), self.clock()):
            raise ApiError(
                404, f"workflow '{workflow_id[:128]}' is not open", code="workflow_not_found"
            )
        body_out = orjson.dumps({"workflow_id": workflow_id, "outcome": outcome, "closed": True})
        return web.Response(body=body_out, content_type="application/json")


def _no_clock() -> float:
    raise RuntimeError("the gateway has not started")
