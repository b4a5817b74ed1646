"""The backend's HTTP API: request and response models, their validation, and the stream's events. No Ray here.

``POST /generate`` takes a :class:`GenerateBody` (JSON). Without ``stream`` it answers with a
:class:`GenerateResponse` (200) or ``{"error": message}`` (400 bad request, 404 unknown model, 413 body too large,
503 queue full or no replica, 500 a bug). With ``stream: true`` it answers with NDJSON events, one per line:

- ``{"event": "waiting"}`` every couple of seconds while the request waits in the queue;
- ``{"event": "started", "replica": ID, "at": UNIX_TIME}`` when a replica takes it;
- ``{"event": "step", "step": i, "steps": n}`` after each denoising step (``i`` from 1 to ``n``);
- ``{"event": "chunk", "done": d, "total": t}`` after each chunk of an autoregressive model;
- ``{"event": "retry", "message": ...}`` when the replica running it died and another one runs it again;
- last, ``{"event": "result", ...GenerateResponse}`` or ``{"event": "error", "status": code, "message": ...,
  "refused": bool}`` (``refused``: turned away before it ran, so it does not count against a rate limit).

``GET /health`` (200 while every model has a running replica, else 503) and ``GET /models`` (:class:`ModelsInfo`).

**Token.** When the backend has a token (``--backend-token-file`` or ``KINEGEN_BACKEND_TOKEN``; ``kinegen serve``
makes one for its own page), every path but ``/health`` needs the header ``Authorization: Bearer TOKEN``, else 401
``{"error": message}`` (:func:`check_authorization`). ``/health`` stays open for load balancers; without the token
it gives only the status and the total replica counts, no model names.
"""

from __future__ import annotations

import base64
import hmac
import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..generation import MAX_FRAMES, MAX_PROMPT_CHARS, MAX_SIDE, MAX_STEPS, GenerationRequest

MAX_BODY_BYTES = 64 * 1024  # a request is a prompt and a few numbers
HEARTBEAT_S = 2.0  # a "waiting" event this often while a streamed request waits in the queue
TOKEN_ENV = "KINEGEN_BACKEND_TOKEN"  # the backend API's shared secret, for both halves (never on a command line)
MIN_TOKEN_CHARS = 16
MAKE_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'
TOKEN_SOURCES = (f"--backend-token-file FILE or {TOKEN_ENV}; a `kinegen serve` started without either made a random "
                 "one for its own page only: start it with one to call its API yourself")


class GenerateBody(BaseModel):
    """One generation request. Unset fields take the model's defaults; the server's own bounds (``/models``'s
    ``limits``) apply on top of these ranges."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: str = Field("", max_length=1000, description="an offered model (GET /models); empty = the first")
    negative_prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    height: int | None = Field(None, ge=1, le=MAX_SIDE)
    width: int | None = Field(None, ge=1, le=MAX_SIDE)
    frames: int | None = Field(None, ge=1, le=MAX_FRAMES)
    steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    guidance: float | None = Field(None, ge=0, le=100)
    seed: int = Field(0, ge=0, lt=2**63)
    accelerators: list[str] = Field(default_factory=list, max_length=2,
                                    description='specs such as "mapguided:speedup=2" (one cache, one attention)')
    compare: bool = Field(False, description="also run the dense baseline and return it with the PSNR")
    output: Literal["bytes", "path"] = Field(
        "bytes", description="bytes: the file in the response (base64); path: written under the backend's "
                             "--output-dir, its path returned (a front end on the same host)")
    stream: bool = Field(False, description="answer with NDJSON progress events (see the module's docs)")


class Media(BaseModel):
    media_type: str  # video/mp4 or image/png
    data: str | None = None  # base64 of the file (output "bytes")
    path: str | None = None  # the file under the backend's output folder (output "path")


class DenseRun(Media):
    timings: dict[str, float | int]


class GenerateResponse(Media):
    model: str
    kind: Literal["video", "image"]
    request: dict[str, Any]  # the request with the model's defaults filled in
    accelerators: list[str]
    timings: dict[str, float | int]  # seconds per stage (text_encoder, transformer, vae_decode, other, total), calls
    stats: list[dict[str, Any]]  # each accelerator's stats
    warnings: list[str]
    chunks: list[dict[str, Any]] = []
    dense: DenseRun | None = None
    psnr_db: float | None = None
    replica: str  # the replica that ran it
    replica_pid: int
    run_s: float  # on the replica, from taking the request to the encoded file
    attempts: int = 1  # 2 when the first replica died mid-run and another ran it again
    queue_s: float | None = None  # from reaching the backend to a replica taking it


class ModelInfo(BaseModel):
    name: str
    defaults: dict[str, Any]
    frame_counts: list[int] | None = None  # an autoregressive model's valid frame counts


class ModelsInfo(BaseModel):
    models: list[ModelInfo]
    limits: dict[str, int]
    replicas: int
    max_queue: int


LIMIT_FIELDS = ("max_side", "max_frames", "max_steps", "max_prompt_chars")


def limits_of(config) -> dict[str, int]:
    """An :class:`~kinegen.apps.service.AppConfig`'s bounds on a request, as ``/models`` reports them."""
    return {k: int(getattr(config, k)) for k in LIMIT_FIELDS}


def check_body(body: GenerateBody, config) -> tuple[GenerationRequest, list[str]]:
    """``body`` as a :class:`GenerationRequest` with its accelerator specs, checked without the model: the request's
    own rules, ``config``'s bounds (:func:`kinegen.apps.service.check_bounds`) and the specs against the registry
    (at most one of each kind). Raises :class:`~kinegen.errors.KinegenError` subclasses with the reason."""
    from ..accelerators.catalog import parse_specs
    from ..apps.service import check_bounds

    request = GenerationRequest(prompt=body.prompt, negative_prompt=body.negative_prompt, height=body.height,
                                width=body.width, frames=body.frames, steps=body.steps, guidance=body.guidance,
                                seed=body.seed)
    check_bounds(config, request)
    specs = [s.strip() for s in body.accelerators]
    parse_specs(specs)
    return request, specs


def request_from_dict(d: dict[str, Any]) -> GenerationRequest:
    """A filled request as the backend returns it (``GenerationRequest.to_dict``) back to a request."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(GenerationRequest)} - {"image"}
    return GenerationRequest(**{k: v for k, v in d.items() if k in names})


def validation_message(errors: list[dict[str, Any]]) -> str:
    """FastAPI's validation errors as one line: ``height: Input should be less than or equal to 4096``."""
    parts = []
    for e in errors[:5]:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "Bad request: " + "; ".join(parts) + "."


def check_token(token: str, where: str) -> str:
    """``token`` (from ``where``: a flag or the environment variable), refused unless it can travel in an HTTP header
    and is long enough not to be guessed."""
    from ..errors import ConfigError

    problem = (f"it has {len(token)}" if len(token) < MIN_TOKEN_CHARS else
               "it has spaces or other characters" if not all("!" <= c <= "~" for c in token) else None)
    if problem:
        raise ConfigError(f"The backend token from {where} must be at least {MIN_TOKEN_CHARS} printable ASCII "
                          f"characters without spaces ({problem}); make one with: {MAKE_TOKEN}")
    return token


def check_authorization(header: str | None, token: str | None) -> str | None:
    """Whether a request's ``Authorization`` header carries the backend's ``token``: None when it does (or when the
    backend has no token), else the message of the 401 answer. The token is compared in constant time."""
    if not token:
        return None
    if not header:
        return ("This backend requires a token: send the header 'Authorization: Bearer TOKEN' with the token the "
                f"backend was started with ({TOKEN_SOURCES}).")
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return "The Authorization header must be 'Bearer TOKEN' (the backend's token); nothing else is accepted."
    if not hmac.compare_digest(given.strip().encode("utf-8"), token.encode("utf-8")):
        return ("The token in the Authorization header is not this backend's; use the token the backend was started "
                f"with ({TOKEN_SOURCES}).")
    return None


def encode_file(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode_file(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def jsonable(x: Any) -> Any:
    """``x`` with numpy arrays and scalars, tensors and tuples as JSON types; non-finite floats become None (JSON has
    no NaN), anything else unknown its ``str``."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, (bool, int, str)):
        return x
    return str(x)


__all__ = ["TOKEN_ENV", "GenerateBody", "GenerateResponse", "ModelsInfo", "check_authorization", "check_body",
           "check_token", "jsonable", "limits_of", "request_from_dict", "validation_message"]
