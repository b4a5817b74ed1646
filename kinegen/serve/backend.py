"""The Ray Serve backend of ``kinegen serve`` (imports Ray: only the serve code path imports this module).

Two deployments in one Serve application (``kinegen``):

- :class:`Generator`, one deployment per model (``generator-0``, ...), ``num_replicas`` replicas, each with its own
  loaded pipeline (:class:`~kinegen.serve.worker.GenerationWorker`), ``ray_actor_options`` of ``num_cpus`` and
  ``num_gpus`` per replica, ``max_ongoing_requests=1`` (a replica runs one generation at a time: the device is the
  bottleneck) and ``max_queued_requests`` = ``--max-queue`` (the bounded queue: more are answered 503 at once),
  and a ``check_health`` that computes on the device (Serve replaces a replica that fails it, or that dies);
- :class:`Ingress`, the HTTP API (FastAPI through ``serve.ingress``; no CPU reserved): ``POST /generate``,
  ``GET /health``, ``GET /models`` (:mod:`kinegen.serve.protocol`). It validates a request before it takes a place
  in the queue, streams the replica's progress, and runs a request again (once) when the replica running it dies, so
  that a replica lost mid-run loses no request (a generation is deterministic in its seed). With a token, every path
  but ``/health`` needs ``Authorization: Bearer TOKEN`` (:func:`kinegen.serve.protocol.check_authorization`).

Ray's ``GradioIngress`` is not used (it breaks with Gradio 4 and later); the Gradio front end is its own process.
"""

# No `from __future__ import annotations` here: FastAPI reads the routes' annotations (the request body's model) at
# runtime, and through serve.ingress's class-based routes a string annotation is not resolved.
import asyncio
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from ..apps.service import AppConfig
from ..errors import KinegenError
from .protocol import (
    HEARTBEAT_S,
    MAX_BODY_BYTES,
    TOKEN_ENV,
    GenerateBody,
    GenerateResponse,
    ModelsInfo,
    check_authorization,
    check_body,
    jsonable,
    validation_message,
)
from .worker import GenerationWorker, error_event

log = logging.getLogger("kinegen.serve")

APP_NAME = "kinegen"
RETRY_WAIT_S = 120.0  # a request whose replica died waits this long at most for a place in the queue again
NO_ACCESS_LOG = {"enable_access_log": False}  # one line per request would drown the operator's log

try:  # the replica died under a running request; Serve's own name for it where this Ray has one
    from ray.serve.exceptions import ReplicaUnavailableError as _ReplicaGone
except ImportError:  # pragma: no cover (older Ray)
    _ReplicaGone = RayActorError
REPLICA_DIED = (RayActorError, _ReplicaGone)


@serve.deployment(max_ongoing_requests=1, health_check_period_s=5, health_check_timeout_s=30,
                  graceful_shutdown_timeout_s=30, max_constructor_retry_count=3, logging_config=NO_ACCESS_LOG)
class Generator:
    """One replica: a loaded pipeline that runs one generation at a time (in a worker thread, so that the replica's
    event loop stays free for health checks and cancellation)."""

    def __init__(self, model: str, limits: dict[str, int], output_dir: str, threads: int | None = None):
        replica = serve.get_replica_context().replica_id.unique_id
        self.worker = GenerationWorker(model, limits, output_dir, threads=threads, replica=replica)
        self._device = ThreadPoolExecutor(1, thread_name_prefix="kinegen-run")  # one run at a time, even a stopping one

    async def check_health(self) -> None:
        await asyncio.to_thread(self.worker.check_health)

    async def info(self):
        """The model's name, defaults and frame counts (a one-item stream: the ingress calls every method so)."""
        yield await asyncio.to_thread(self.worker.info)

    async def generate(self, body: dict[str, Any]):
        """Run one request; yields ``started``, ``step``/``chunk`` events, then ``result`` or ``error``. Cancelled
        (the client left), the run stops at its next step."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def emit(ev: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ev)

        def work() -> None:
            try:
                emit({"event": "result", **self.worker.generate(body, emit=emit, cancel=cancel)})
            except BaseException as e:  # handed to the caller as an event
                emit(error_event(e))

        yield {"event": "started", "replica": self.worker.replica, "at": time.time()}
        loop.run_in_executor(self._device, work)
        try:
            while True:
                ev = await events.get()
                yield ev
                if ev["event"] in ("result", "error"):
                    return
        finally:
            cancel.set()  # finished, or cancelled: a running run stops at its next step


# What the ingress's methods use must be defined above the class: serve.ingress serializes the routes when the class
# is decorated.
def _quietly(task: asyncio.Future) -> None:
    """Read a left-behind task's outcome, so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


async def _ndjson(events):
    """Events as NDJSON lines."""
    async for ev in events:
        yield json.dumps(jsonable(ev)) + "\n"


api = FastAPI(title="kinegen serve", description="Video generation on Ray Serve replicas: POST /generate, GET "
              "/health, GET /models. See kinegen/serve/protocol.py.")


OPEN_PATHS = ("/health",)  # load balancers probe it without the token (it names no model then)


@api.middleware("http")
async def _guard(request: Request, call_next):
    """The token (every path but /health; the ingress's replica keeps it in its environment, where this function,
    which Serve ships apart from the class, reads it), then the body's size, before anything else is read."""
    if request.url.path not in OPEN_PATHS:
        denied = check_authorization(request.headers.get("authorization"), os.environ.get(TOKEN_ENV))
        if denied is not None:
            log.info("request refused (401): %s %s", request.method, request.url.path)
            return JSONResponse({"error": denied}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > MAX_BODY_BYTES):
        return JSONResponse({"error": f"The request body is larger than {MAX_BODY_BYTES // 1024} KB; a generation "
                                      "request is a prompt and a few numbers."}, status_code=413)
    return await call_next(request)


@api.exception_handler(RequestValidationError)
async def _bad_request(_request: Request, exc: RequestValidationError):
    message = validation_message(exc.errors())
    log.info("request refused: %s", message)
    return JSONResponse({"error": message}, status_code=400)


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000, health_check_period_s=10,
                  logging_config=NO_ACCESS_LOG)
@serve.ingress(api)
class Ingress:
    """The HTTP API in front of the :class:`Generator` deployments (one per model)."""

    def __init__(self, generators: dict[str, Any], limits: dict[str, int], max_queue: int, replicas: int,
                 deployments: dict[str, str], token: str | None = None):
        # The token for the middleware: this replica's own process environment (set or cleared, whatever the
        # process inherited).
        if token:
            os.environ[TOKEN_ENV] = token
        else:
            os.environ.pop(TOKEN_ENV, None)
        self.token = token or None
        # One streaming handle per model, kept: the queue bound is counted per caller handle.
        self.handles = {m: h.options(stream=True) for m, h in generators.items()}
        self.models = list(generators)
        self.deployments = deployments  # model -> deployment name, for /health
        self.config = AppConfig(models=self.models, gan_models=[], **limits)
        self.limits, self.max_queue, self.replicas = limits, max_queue, replicas
        self._info: list[dict[str, Any]] | None = None

    # ------------------------------------------------------------------ state

    @api.get("/health")
    async def health(self, request: Request):
        """``ok`` (200) with every replica running, ``degraded`` (200) with at least one per model, ``down`` (503)
        while a model has none (starting, or every replica lost; Serve starts new ones). Open to all; without the
        token (when there is one) only the status and the total replica counts, no model names."""
        status = await asyncio.to_thread(serve.status)
        app = status.applications.get(APP_NAME)
        deps = app.deployments if app is not None else {}
        models = {}
        for model, name in self.deployments.items():
            d = deps.get(name)
            running = int(d.replica_states.get("RUNNING", 0)) if d is not None else 0
            models[model] = {"replicas_running": running, "replicas": self.replicas,
                             "deployment_status": str(getattr(d, "status", "MISSING"))}
        counts = [m["replicas_running"] for m in models.values()]
        state = "ok" if all(c >= self.replicas for c in counts) else "degraded" if all(counts) else "down"
        code = 503 if state == "down" else 200
        if check_authorization(request.headers.get("authorization"), self.token) is not None:
            return JSONResponse({"status": state, "replicas_running": sum(counts),
                                 "replicas": self.replicas * len(counts)}, status_code=code)
        return JSONResponse({"status": state, "models": models}, status_code=code)

    @api.get("/models")
    async def list_models(self):
        """The offered models (defaults, valid frame counts), the server's bounds, replicas and queue."""
        if self._info is None:
            infos = []
            for model in self.models:
                async for info in self.handles[model].info.remote():
                    infos.append(info)
            self._info = infos
        return ModelsInfo(models=self._info, limits=self.limits, replicas=self.replicas,
                          max_queue=self.max_queue).model_dump()

    # ------------------------------------------------------------------ generation

    @api.post("/generate")
    async def generate(self, body: GenerateBody):
        model = body.model or self.models[0]
        if model not in self.handles:
            message = f"Model {model!r} is not offered by this server; choose one of: {', '.join(self.models)}."
            log.info("request refused: %s", message)
            return JSONResponse({"error": message}, status_code=404)
        try:
            check_body(body, self.config)  # before it takes a place in the queue
        except KinegenError as e:
            log.info("request refused: %s", " ".join(str(e).split()))
            return JSONResponse({"error": str(e)}, status_code=400)
        payload = body.model_dump()
        payload["model"] = model
        events = self._events(model, payload)
        if body.stream:
            return StreamingResponse(_ndjson(events), media_type="application/x-ndjson")
        async for ev in events:
            if ev["event"] == "result":
                return GenerateResponse.model_validate({k: v for k, v in ev.items() if k != "event"}).model_dump()
            if ev["event"] == "error":
                return JSONResponse({"error": ev["message"]}, status_code=ev["status"])
        return JSONResponse({"error": "The run ended without a result."}, status_code=500)  # pragma: no cover

    def _busy(self, model: str) -> dict[str, Any]:
        waiting = "1 request is" if self.max_queue == 1 else f"{self.max_queue} requests are"
        message = (f"The backend's queue is full: every replica of {model} is busy and {waiting} waiting (--max-queue "
                   f"{self.max_queue}). Try again in a minute.")
        log.info("request refused: %s", message)
        return {"event": "error", "status": 503, "message": message, "refused": True}

    async def _events(self, model: str, payload: dict[str, Any]):
        """The replica's events for one request, with ``waiting`` heartbeats, ``attempts`` and ``queue_s`` added to
        the result; a replica that dies under the request: the request runs again (once) on another replica."""
        received = started = time.time()
        attempt, retry_since = 1, None
        while True:
            stream = self.handles[model].generate.remote(payload)
            pending = None
            try:
                iterator = stream.__aiter__()
                while True:
                    pending = asyncio.ensure_future(iterator.__anext__())
                    while not (await asyncio.wait({pending}, timeout=HEARTBEAT_S))[0]:
                        yield {"event": "waiting"}
                    try:
                        ev = pending.result()
                    except StopAsyncIteration:
                        pending = None
                        return
                    pending = None
                    if ev["event"] == "started":
                        started = ev["at"]
                    elif ev["event"] == "result":
                        ev.update(attempts=attempt, queue_s=max(0.0, started - received))
                    yield ev
                    if ev["event"] in ("result", "error"):
                        return
            except BackPressureError:
                if retry_since is None or time.time() - retry_since > RETRY_WAIT_S:
                    yield self._busy(model)
                    return
                await asyncio.sleep(1.0)  # a request being run again waits for a place rather than being lost
            except DeploymentUnavailableError as e:
                yield {"event": "error", "status": 503, "refused": True,
                       "message": f"{model} has no replica that could start ({e}); see the backend's log."}
                return
            except REPLICA_DIED as e:
                if attempt >= 2:
                    yield {"event": "error", "status": 503, "refused": False,
                           "message": f"Two replicas died running this request ({type(e).__name__}); it was not "
                                      "finished. See the backend's log."}
                    return
                attempt, retry_since = attempt + 1, time.time()
                log.warning("a replica of %s died under a request (%s); running it again", model, type(e).__name__)
                yield {"event": "retry", "message": f"The replica running this request stopped ({type(e).__name__});"
                                                    " running it again on another replica."}
            finally:
                if pending is not None and not pending.done():  # the client left: stop the replica's run
                    pending.add_done_callback(_quietly)
                    pending.cancel()
                    stream.cancel()


def build_application(models: list[str], *, replicas: int, cpus_per_replica: float, gpus_per_replica: float,
                      max_queue: int, limits: dict[str, int], output_dir: str, threads: int | None,
                      token: str | None = None):
    """The Serve application: one :class:`Generator` deployment per model behind the :class:`Ingress` (which
    requires ``token``, when given, on every path but /health)."""
    generators, deployments = {}, {}
    for i, model in enumerate(models):
        name = f"generator-{i}"
        deployments[model] = name
        generators[model] = Generator.options(
            name=name, num_replicas=replicas, max_queued_requests=max_queue,
            ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        ).bind(model, limits, output_dir, threads)
    return Ingress.bind(generators, limits, max_queue, replicas, deployments, token)


__all__ = ["APP_NAME", "Generator", "Ingress", "build_application"]
