"""The emulated engine server: one ``EngineModel`` behind vLLM's HTTP and ZMQ faces.

``EngineServer(config)`` owns an aiohttp application, the ``EngineDriver`` that runs the
model in real time, the Prometheus metrics and, when enabled, the KV-event publisher.
Routes (OpenAI and vLLM shapes):

* ``POST /v1/chat/completions``, ``POST /v1/completions``: streaming (SSE) or not;
* ``GET /v1/models``, ``GET /health`` (200 when ready, 503 while cold or loading),
  ``GET /metrics``;
* ``POST /tokenize``, ``/detokenize``, ``/v1/chat/completions/render``,
  ``/v1/completions/render`` (what vllm-router calls before routing);
* ``GET``/``POST /admin/faults`` (see ``faults.py``).

Every error, including unknown routes and oversized bodies, is OpenAI-style JSON; the
handlers never let an exception become a 500 with a traceback. A client that goes away
cancels its handler (aiohttp ``handler_cancellation``), which aborts the request in the
model and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from inferplane.engine.completions import Completion
from inferplane.engine.driver import EngineDriver
from inferplane.engine.faults import FaultConfig, FaultError, FaultInjector, merge_update
from inferplane.engine.kv_publisher import KVEncoding, KVEventPublisher
from inferplane.engine.metrics import CONTENT_TYPE, EngineMetrics
from inferplane.engine.model import EngineModel
from inferplane.engine.profiles import load_profile
from inferplane.engine.protocol import (
    ApiError,
    ApiKind,
    bad_request,
    chat_prompt_ids,
    check_model,
    completion_prompt_ids,
    parse_generation,
    parse_json_object,
)
from inferplane.engine.responses import ResponseFormat
from inferplane.engine.types import EngineRequest, EngineState
from inferplane.tokenizer import get_tokenizer

log = logging.getLogger("inferplane.engine")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything one emulated engine needs; port 0 binds a free port."""

    model: str = "llama-3-8b"
    gpu: str = "h100"
    tensor_parallel: int | None = None
    served_model_name: str | None = None
    time_scale: float = 1.0
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 0
    kv_events: bool = False
    kv_events_port: int = 0
    kv_replay_port: int | None = 0
    kv_encoding: KVEncoding = KVEncoding.ARRAY
    cold_start: bool = False
    max_in_flight: int = 4096  # beyond this a new request gets 503 (the queue is bounded)
    faults: FaultConfig = field(default_factory=FaultConfig)
    #: Profile knobs this engine runs with instead of the data file's (e.g. max_num_seqs).
    profile_overrides: tuple[tuple[str, float], ...] = ()

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


def _json(payload: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def _error_response(err: ApiError) -> web.Response:
    return web.Response(body=err.body(), status=err.status, content_type="application/json")


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into OpenAI-style JSON (never an HTML page or a traceback)."""
    try:
        return await handler(request)
    except ApiError as err:
        return _error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err_type = "invalid_request_error" if exc.status < 500 else "server_error"
        return _error_response(ApiError(exc.status, exc.reason, err_type=err_type))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unexpected error in %s %s", request.method, request.path)
        return _error_response(ApiError(500, "internal error", err_type="server_error"))


class EngineServer:
    """One emulated engine: HTTP app, driver, metrics, KV events, faults."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        profile = load_profile(
            config.model,
            config.gpu,
            config.tensor_parallel,
            overrides=dict(config.profile_overrides),
        )
        start_state = EngineState.COLD if config.cold_start else EngineState.READY
        self.model = EngineModel(
            profile, time_scale=config.time_scale, seed=config.seed, start_state=start_state
        )
        self.tokenizer = get_tokenizer()
        self.metrics = EngineMetrics(config.model_name, self.model.stats)
        self.faults = FaultInjector(config.faults, seed=config.seed)
        self.driver = EngineDriver(self.model, metrics=self.metrics, faults=self.faults)
        self.publisher: KVEventPublisher | None = None
        self.max_in_flight = config.max_in_flight
        self.app = self._build_app()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def topic(self) -> str:
        return f"kv@{self.config.host}:{self.port}@{self.config.model_name}"

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/prometheus/metrics", self._metrics)  # where trtllm-serve has it
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_post("/v1/chat/completions/render", self._render_chat)
        app.router.add_post("/v1/completions/render", self._render_completion)
        app.router.add_get("/admin/faults", self._get_faults)
        app.router.add_post("/admin/faults", self._post_faults)
        return app

    async def start(self) -> None:
        """Bind the HTTP site (and ZMQ sockets) and start the engine."""
        loop = asyncio.get_running_loop()
        self.driver.wall_clock_offset_s = time.time() - loop.time()
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, backlog=1024)
        await site.start()
        self.port = self._runner.addresses[0][1]
        if self.config.kv_events:
            self.publisher = KVEventPublisher(
                self.topic,
                host=self.config.host,
                pub_port=self.config.kv_events_port,
                replay_port=self.config.kv_replay_port,
                encoding=self.config.kv_encoding,
            )
            await self.publisher.start()
            self.driver.kv_sink = self.publisher.publish
        await self.driver.start()

    async def stop(self) -> None:
        await self.driver.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.publisher is not None:
            await self.publisher.close()
            self.publisher = None

    # -- generation -------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, ApiKind.CHAT)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, ApiKind.COMPLETION)

    async def _generate(self, request: web.Request, kind: ApiKind) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        gen = parse_generation(
            body,
            kind,
            served_model=self.config.model_name,
            max_model_len=self.model.max_model_len,
            tokenizer=self.tokenizer,
        )
        status = self.faults.draw_error_status()
        if status is not None:
            raise ApiError(status, "Injected fault: the engine failed this request",
                           err_type="server_error", code="injected_fault")  # fmt: skip
        self._check_ready()
        prefix = "chatcmpl" if kind is ApiKind.CHAT else "cmpl"
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        engine_request = EngineRequest(
            request_id, gen.prompt_token_ids, gen.max_tokens, gen.priority, gen.ignore_eos
        )
        try:
            stream = self.driver.submit(engine_request)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        fmt = ResponseFormat(kind, request_id, int(self.driver.wall_time_s()), gen.model)
        completion = Completion(self.driver, self.tokenizer, gen, stream, fmt)
        try:
            if gen.stream:
                return await completion.stream(request)
            return await completion.collect(request)
        finally:
            if stream.finished is None:
                self.driver.abort(request_id)

    def _check_ready(self) -> None:
        if self.driver.num_in_flight >= self.max_in_flight:
            raise ApiError(
                503,
                f"The engine has {self.driver.num_in_flight} requests in flight; retry later",
                err_type="service_unavailable",
                code="engine_overloaded",
            )
        state = self.driver.state
        if state is not EngineState.READY:
            raise ApiError(
                503,
                f"The engine is not ready (state: {state.value}); retry later",
                err_type="service_unavailable",
                code="engine_not_ready",
            )

    # -- small endpoints --------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        name = self.config.model_name
        card = {
            "id": name,
            "object": "model",
            "created": int(self.driver.wall_time_s()),
            "owned_by": "inferplane",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.model.max_model_len,
        }
        return _json({"object": "list", "data": [card]})

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self._check_ready()
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def _prompt_ids(self, body: dict[str, object]) -> list[int]:
        check_model(body, self.config.model_name, required=False)
        if "messages" in body:
            return chat_prompt_ids(body, self.tokenizer)
        return completion_prompt_ids(body, self.tokenizer)

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        ids = self._prompt_ids(parse_json_object(await request.read()))
        max_len = self.model.max_model_len
        return _json({"count": len(ids), "max_model_len": max_len, "tokens": ids})

    async def _detokenize(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        check_model(body, self.config.model_name, required=False)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise bad_request("'tokens' must be a list of token ids", "tokens")
        try:
            self.tokenizer.check_ids(tokens)
        except ValueError as exc:
            raise bad_request(str(exc), "tokens") from None
        return _json({"prompt": self.tokenizer.decode(tokens)})

    async def _render_chat(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        check_model(body, self.config.model_name, required=False)
        ids = chat_prompt_ids(body, self.tokenizer)
        return _json({"model": self.config.model_name, "token_ids": ids, "features": None})

    async def _render_completion(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_object(await request.read())
        check_model(body, self.config.model_name, required=False)
        ids = completion_prompt_ids(body, self.tokenizer)
        return _json([{"model": self.config.model_name, "token_ids": ids, "features": None}])

    async def _get_faults(self, request: web.Request) -> web.StreamResponse:
        return _json(self.faults.config.to_json())

    async def _post_faults(self, request: web.Request) -> web.StreamResponse:
        update = parse_json_object(await request.read())
        try:
            config, restart = merge_update(self.faults.config, update)
        except FaultError as exc:
            raise bad_request(str(exc)) from None
        self.apply_faults(config, restart=restart)
        return _json(self.faults.config.to_json())

    def apply_faults(self, config: FaultConfig, *, restart: bool = False) -> None:
        """Arm ``config`` (the admin API and tests call this); ``restart`` crashes now."""
        self.faults.config = config
        self.driver.set_slowdown(config.slowdown)
        self.driver.set_hang(config.hang)
        if restart:
            self.driver.restart()
