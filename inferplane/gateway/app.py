"""The gateway's HTTP application: the OpenAI-compatible front door of a configured fleet.

A call walks: authenticate and read the context headers (``context``), read and check the
body, resolve the model name to served models (routes and fallbacks), ask the policy core to
rank endpoints (``inferplane.core.routing.route`` over the tracker's views), then hand the call
to the proxy, which answers the client from the first endpoint that responds. The recorder
accounts for it afterwards. Every refusal is an OpenAI error JSON (the error middleware),
never a traceback. Besides generation: ``/v1/models``, ``/health`` (the process is alive),
``/ready`` (some endpoint can take work), ``/metrics``, ``/v1/stats`` and
``POST /v1/workflows/{id}/end``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from inferplane.config import FleetConfig
from inferplane.core.accounting import TaskOutcome
from inferplane.core.types import CallContext, EndpointState
from inferplane.gateway.context import (
    ApiKind,
    Authenticator,
    RequestContext,
    parse_body,
    parse_headers,
    parse_json_object,
    upstream_body,
)
from inferplane.gateway.errors import ApiError, error_response, from_http_exception
from inferplane.gateway.metrics import CONTENT_TYPE
from inferplane.gateway.proxy import Candidate, Exchange, Proxy
from inferplane.gateway.recorder import Recorder
from inferplane.gateway.router import GatewayRouter
from inferplane.gateway.tracker import EndpointTracker

log = logging.getLogger("inferplane.gateway")

#: Content types that cannot be a JSON body. Others are tried as JSON: curl -d sends
#: form-urlencoded and some clients octet-stream, with perfectly good JSON inside.
_NOT_JSON_TYPES = ("multipart/", "text/html", "application/xml", "text/xml")


class Gateway:
    """The live body for one fleet config. Components are built when the app starts."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._auth = Authenticator(config.gateway.auth)
        self._retries = config.gateway.retries_before_first_byte
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
        self._fallback = {r.name: r.allow_fallback for r in config.routes}
        self._targets = {m: config.targets_for(m) for m in config.model_names()}
        # Long-lived routing state: predictor, workflow affinity, prefix index, KV events.
        self.router = GatewayRouter(config, config.gateway.seed)
        self._call_ids = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self.clock: Callable[[], float] = _no_clock
        self.session: aiohttp.ClientSession | None = None
        self.tracker: EndpointTracker
        self.recorder: Recorder
        self.proxy: Proxy

    # ---- lifecycle -------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors], client_max_size=self.config.gateway.max_body_bytes
        )
        app.router.add_post(ApiKind.CHAT, self._chat)
        app.router.add_post(ApiKind.COMPLETIONS, self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/stats", self._stats)
        app.router.add_post("/v1/workflows/{workflow_id}/end", self._end_workflow)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        await self.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.stop()

    async def start(self) -> None:
        gw = self.config.gateway
        self.clock = asyncio.get_running_loop().time
        connector = aiohttp.TCPConnector(limit=gw.max_connections, limit_per_host=0)
        self.session = aiohttp.ClientSession(connector=connector)
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
        self.proxy = Proxy(self.session, self.tracker, gw.timeouts, self._retries, self.clock)
        await self.tracker.start(self.session)
        self.router.start()
        self._tasks.append(asyncio.create_task(self._expire_loop()))
        log.info("gateway started", extra={"endpoints": len(infos), "ready": self._num_ready()})

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.router.stop()
        if self.session is not None:
            await self.tracker.stop()
            await self.session.close()
            self.session = None

    async def _expire_loop(self) -> None:
        period_s = min(5.0, self.config.gateway.workflow_idle_ttl_s / 4)
        while True:
            await asyncio.sleep(period_s)
            self.recorder.accountant.expire(self.clock())

    def _num_ready(self) -> int:
        return sum(self.tracker.state(n) is EndpointState.READY for n in self.tracker.names())

    # ---- errors ----------------------------------------------------------------------------

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except ApiError as err:
            if not err.recorded:
                self.recorder.reject(None, err.status, err.code or err.error_type, self.clock())
            return error_response(err)
        except web.HTTPException as exc:
            http_err = from_http_exception(exc)
            code = http_err.code or http_err.error_type
            self.recorder.reject(None, http_err.status, code, self.clock())
            return error_response(http_err)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("unexpected error", extra={"path": request.path})
            return error_response(ApiError(500, "internal gateway error", code="internal"))

    # ---- generation ------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, ApiKind.CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, ApiKind.COMPLETIONS)

    async def _read_context(
        self, request: web.Request, path: str
    ) -> tuple[RequestContext, bytes, dict[str, Any]]:
        now = self.clock()
        hdr = parse_headers(request.headers, self._auth, now)
        ctype = request.headers.get("Content-Type")
        if ctype and ctype.lower().startswith(_NOT_JSON_TYPES):
            raise ApiError(415, f"unsupported Content-Type {ctype[:60]!r}; send JSON")
        limit = self.config.gateway.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, f"request body over {limit} bytes", code="body_too_large")
        raw = await request.read()
        body = parse_json_object(raw)
        model, stream, wants_usage, prompt_tokens, max_tokens = parse_body(path, body)
        ctx = RequestContext(
            request_id=hdr.request_id,
            tenant=hdr.caller.tenant,
            priority=hdr.priority,
            arrival_s=now,
            model=model,
            path=path,
            stream=stream,
            client_wants_usage=wants_usage,
            num_prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            deadline_s=hdr.deadline_s,
            ttft_budget_s=hdr.ttft_budget_s,
            workflow_id=hdr.workflow_id,
            workflow_step=hdr.workflow_step,
            workflow_steps=hdr.workflow_steps,
        )
        return ctx, raw, body

    def _plan(
        self, ctx: RequestContext, raw: bytes, body: dict[str, Any]
    ) -> tuple[list[Candidate], dict[str, CallContext], str]:
        """Ranked endpoints to try (over the model's targets, in order), the call as each
        endpoint's target model sees it, and why."""
        targets = self._targets.get(ctx.model, ())
        if not targets:
            raise ApiError(
                404, f"the model '{ctx.model}' does not exist", param="model",
                code="model_not_found",
            )  # fmt: skip
        now = self.clock()
        prompt = self.router.prompt_keys(ctx.path, body, targets)
        candidates: list[Candidate] = []
        calls: dict[str, CallContext] = {}
        reasons: list[str] = []
        for target in targets:
            call = CallContext(
                request_id=ctx.request_id, tenant=ctx.tenant, model=target,
                priority=ctx.priority, arrival_s=ctx.arrival_s,
                num_prompt_tokens=prompt.num_tokens or ctx.num_prompt_tokens,
                max_tokens=ctx.max_tokens, deadline_s=ctx.deadline_s,
                ttft_budget_s=ctx.ttft_budget_s, workflow_id=ctx.workflow_id,
                workflow_step=ctx.workflow_step, workflow_steps=ctx.workflow_steps,
                stream=ctx.stream, prompt_block_keys=prompt.keys,
            )  # fmt: skip
            decision = self.router.route(call, self.tracker.views(now, target), now)
            reasons.append(f"{target}: {decision.reason}" if len(targets) > 1 else decision.reason)
            if decision.ranked:
                data = upstream_body(raw, body, target, ctx.stream)
                for name in decision.names():
                    candidates.append(Candidate(name, self.tracker.info(name).url + ctx.path, data))
                    calls.setdefault(name, call)
            if len(candidates) > self._retries or not self._fallback.get(ctx.model, True):
                break
        return candidates, calls, "; ".join(reasons)

    async def _generate(self, request: web.Request, path: str) -> web.StreamResponse:
        ctx, raw, body = await self._read_context(request, path)
        try:
            if self._in_flight >= self.config.gateway.max_in_flight:
                raise ApiError(
                    429, "gateway is at its in-flight limit", code="gateway_overloaded",
                    headers={"Retry-After": "1"},
                )  # fmt: skip
            candidates, calls, reason = self._plan(ctx, raw, body)
            if not candidates:
                raise ApiError(
                    503, f"no endpoint can take model '{ctx.model}' now ({reason})",
                    code="no_endpoint", headers={"Retry-After": "1"},
                )  # fmt: skip
        except ApiError as err:
            err.recorded = True
            err.headers["X-Request-Id"] = ctx.request_id
            self.recorder.reject(ctx, err.status, err.code or err.error_type, self.clock())
            raise
        return await self._proxy_call(request, ctx, candidates, calls, reason)

    async def _proxy_call(
        self,
        request: web.Request,
        ctx: RequestContext,
        candidates: list[Candidate],
        calls: dict[str, CallContext],
        reason: str,
    ) -> web.StreamResponse:
        router, key = self.router, str(next(self._call_ids))
        sent_at: list[float] = [ctx.arrival_s]
        ex = Exchange(on_first_token=lambda t: router.on_first_token(key, t - sent_at[0], t))
        cost: list[float] = []

        def finish(done: Exchange) -> float:
            if not cost:
                now = self.clock()
                cost.append(self.recorder.finish(ctx, done, reason, now))
                ok = done.completed and done.endpoint is not None
                usage = (done.prompt_tokens, done.cached_tokens) if ok else None
                router.on_finish(key, now, tpot_s=done.tpot_s(), usage=usage)
                if ok and done.endpoint is not None:
                    router.remember_workflow(ctx.workflow_id, done.endpoint, now)
            return cost[0]

        def on_attempt(endpoint: str, retry_reason: str | None) -> None:
            now = sent_at[0] = self.clock()
            if retry_reason is not None:
                self.recorder.on_retry(retry_reason)
            self.recorder.on_attempt(ctx, endpoint, now)
            router.on_dispatch(key, calls[endpoint], self.tracker.view(endpoint, now), now)

        self._in_flight += 1
        try:
            return await self.proxy.forward(request, ctx, candidates, ex, finish, on_attempt)
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
        now = self.clock()
        t = self.tracker
        self.recorder.metrics.refresh_endpoints((n, t.state(n), t.in_flight(n)) for n in t.names())
        self.recorder.metrics.refresh_routing(
            self.router.kv_event_status(), self.router.prefix_stats()
        )
        self.recorder.refresh_spend(now)
        return web.Response(
            body=self.recorder.metrics.render(), headers={"Content-Type": CONTENT_TYPE}
        )

    async def _stats(self, request: web.Request) -> web.Response:
        self._auth.caller(request.headers)
        now = self.clock()
        body = {
            "in_flight": self._in_flight,
            "endpoints": self.tracker.stats(now),
            "routing": self.router.stats(),
            "accounting": self.recorder.snapshot(now),
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _end_workflow(self, request: web.Request) -> web.Response:
        self._auth.caller(request.headers)
        workflow_id = request.match_info["workflow_id"]
        body = parse_json_object(await request.read())
        outcome = body.get("outcome")
        if outcome not in (TaskOutcome.SUCCESS.value, TaskOutcome.FAILURE.value):
            raise ApiError(400, "'outcome' must be 'success' or 'failure'", param="outcome")
        if not self.recorder.end_workflow(workflow_id, TaskOutcome(outcome), self.clock()):
            raise ApiError(
                404, f"workflow '{workflow_id[:128]}' is not open", code="workflow_not_found"
            )
        body_out = orjson.dumps({"workflow_id": workflow_id, "outcome": outcome, "closed": True})
        return web.Response(body=body_out, content_type="application/json")


def _no_clock() -> float:
    raise RuntimeError("the gateway has not started")


async def start_server(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving ``app``; returns the runner and the bound port (port 0 picks one).

    Handler cancellation is on: a client that disconnects cancels its handler, which closes
    the upstream connection and so aborts the engine's work.
    """
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, int(bound)
