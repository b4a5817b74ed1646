"""The front end's side of ``kinegen serve``: :class:`RemoteRunner`, a :class:`~kinegen.apps.service.Service` runner
that sends each generation to the Ray Serve backend over HTTP (``POST /generate`` with ``stream``) instead of running
it in this process. No Ray here: ``kinegen serve --frontend-only --backend URL`` runs without it.

The page and its rules stay the app's: the Service validates the request and applies the per-user rate limit before
the request leaves, writes the returned file atomically under its ``--output-dir`` and records the run in its
history (with the replica that ran it). Stop (or a closed page) closes the HTTP stream, and the backend cancels the
run at its next step. With a token, every request carries ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from ..apps.service import RunOutput
from ..errors import ConfigError, InvalidRequestError, KinegenError, RunCancelled
from .protocol import TOKEN_ENV, decode_file, request_from_dict

log = logging.getLogger("kinegen.serve")

BUSY_RETRY_S = 1.0  # a request the backend found no room for is tried once more after this long


class BackendUnavailable(KinegenError):
    """The backend does not answer (not started, stopped, or unreachable)."""


class BackendBusy(KinegenError):
    """The backend's bounded queue is full, or no replica is running."""


class BackendError(KinegenError):
    """The backend failed a run for a reason that is not the request's (the message says which)."""


class BackendTokenRefused(ConfigError):
    """The backend requires a token and this front end sent none, or another one (an operator's setting)."""


@dataclasses.dataclass
class RemoteResult:
    """A run done by the backend, as the Service needs it: what a :class:`~kinegen.generation.GenerationResult`
    gives, with the encoded file in place of the frames."""

    kind: str
    request: Any  # GenerationRequest, the model's defaults filled in
    timings: dict[str, float]
    accelerators: list[dict[str, Any]]
    warnings: list[str]
    chunks: list[dict[str, Any]]
    data: bytes
    media_type: str

    def save(self, path) -> Path:
        """Write the file atomically (a temporary file beside ``path``, then a rename)."""
        from ..media import atomic_path, check_output_path

        path = check_output_path(path, self.kind)
        with atomic_path(path) as tmp:
            tmp.write_bytes(self.data)
        return path


def _result(fields: dict[str, Any], request) -> RemoteResult:
    if fields.get("data") is None:
        raise BackendError("The backend answered without the file (it wrote it under its own output folder); the "
                           "front end asks for output \"bytes\", so the backend is a different version.")
    return RemoteResult(kind=fields.get("kind", "video"), request=request, timings=fields["timings"],
                        accelerators=fields.get("stats") or [], warnings=fields.get("warnings") or [],
                        chunks=fields.get("chunks") or [], data=decode_file(fields["data"]),
                        media_type=fields.get("media_type", ""))


class RemoteRunner:
    """Runs generations on a ``kinegen serve`` backend at ``url`` (``http://HOST:PORT``).

    Args:
        url: the backend's address.
        token: the backend's token, sent as ``Authorization: Bearer TOKEN`` with every request (None: none sent).
        connect_timeout_s: how long to wait for a connection.
        silence_timeout_s: how long the backend may say nothing before the run counts as lost (it sends an event at
            least every couple of seconds while a request waits or runs, unless one denoising step takes longer).
    """

    local = False

    def __init__(self, url: str, token: str | None = None, connect_timeout_s: float = 10.0,
                 silence_timeout_s: float = 600.0):
        import httpx

        self.url = url.rstrip("/")
        self.has_token = bool(token)
        self._timeout = httpx.Timeout(connect=connect_timeout_s, read=silence_timeout_s, write=30.0, pool=30.0)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # one connection per concurrent run; Gradio's concurrency limit bounds how many there are
        self._http = httpx.Client(timeout=self._timeout, limits=httpx.Limits(max_connections=256), headers=headers)
        self._info: dict[str, Any] | None = None
        self._info_lock = threading.Lock()

    # ------------------------------------------------------------------ the backend's state

    def _get(self, path: str) -> tuple[int, dict[str, Any]]:
        import httpx

        try:
            r = self._http.get(f"{self.url}{path}", timeout=30.0)
        except httpx.HTTPError as e:
            raise self._unavailable(e) from None
        try:
            body = r.json()
        except ValueError:
            raise BackendError(f"{self.url}{path} answered {r.status_code} without JSON; is {self.url} a kinegen "
                               "serve backend?") from None
        if r.status_code == 401:
            raise self._token_refused(body.get("error", ""))
        return r.status_code, body

    def _token_refused(self, message: str) -> BackendTokenRefused:
        """The backend answered 401 (``message``: its reason, logged)."""
        log.warning("the backend at %s refused this front end's token: %s", self.url, message)
        what = "with a token that is not its own" if self.has_token else "without a token"
        return BackendTokenRefused(f"The generation backend at {self.url} requires a token and this front end called "
                                   f"it {what}. Give the front end the backend's token: --backend-token-file FILE "
                                   f"(its first line) or the environment variable {TOKEN_ENV} (a backend started by "
                                   "`kinegen serve` without either has a random token for its own page only: start "
                                   "it with one).")

    def _unavailable(self, e: Exception) -> BackendUnavailable:
        return BackendUnavailable(f"The generation backend at {self.url} is not answering ({type(e).__name__}: "
                                  f"{e}). Start it with `kinegen serve` (or check --backend), then try again.")

    def health(self) -> dict[str, Any]:
        """``GET /health``: ``status`` (ok, degraded or down) and each model's running and wanted replicas (without
        the backend's token, only the totals)."""
        return self._get("/health")[1]

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 1.0) -> dict[str, Any]:
        """Wait until every model has a running replica (models load when the backend starts)."""
        deadline = time.monotonic() + timeout_s
        last: Exception | str = "no answer yet"
        while time.monotonic() < deadline:
            try:
                code, body = self._get("/health")
                if code == 200:
                    return body
                last = f"status {body.get('status')}"
            except BackendTokenRefused:
                raise
            except KinegenError as e:
                last = e
            time.sleep(poll_s)
        raise BackendUnavailable(f"The generation backend at {self.url} was not ready within {timeout_s:.0f} s "
                                 f"({last}). Is `kinegen serve --backend-only` running there?")

    def info(self, refresh: bool = False) -> dict[str, Any]:
        """``GET /models`` (kept after the first call): the models, the server's limits, replicas and queue."""
        with self._info_lock:
            if self._info is None or refresh:
                code, body = self._get("/models")
                if code != 200:
                    raise BackendUnavailable(f"The generation backend at {self.url} cannot list its models "
                                             f"({body.get('error', code)}).")
                self._info = body
            return self._info

    def models(self) -> dict[str, dict[str, Any]]:
        return {m["name"]: m for m in self.info()["models"]}

    def _model(self, model: str) -> dict[str, Any]:
        models = self.models()
        if model not in models:
            raise InvalidRequestError(f"Model {model!r} is not offered by this server; choose one of: "
                                      f"{', '.join(models)}.")
        return models[model]

    # ------------------------------------------------------------------ what the Service asks a runner

    def pipeline(self, model: str, kind: str = "text"):
        raise InvalidRequestError(f"This front end runs no model itself: generations run on the backend at {self.url}. "
                                  "GAN grids and profiles need the models in the same process: use `kinegen app`.")

    def omni(self, model: str):
        raise InvalidRequestError("This front end runs no model itself; understanding videos needs the omni model in "
                                  "the same process: use `kinegen app`.")

    def model_defaults(self, model: str) -> dict[str, Any]:
        return dict(self._model(model)["defaults"])

    def frame_counts(self, model: str) -> list[int]:
        counts = self._model(model).get("frame_counts")
        if counts is None:
            raise InvalidRequestError(f"{model} is not generated chunk by chunk: it takes any frame count of the form "
                                      "4k+1.")
        return list(counts)

    def run(self, model: str, request, accelerators: list[str], *, compare: bool = False, check=None, admit=None,
            refund=None, step_callback=None, chunk_callback=None, cancel: threading.Event | None = None) -> RunOutput:
        """Send one request to the backend and wait for its file, passing on its progress.

        ``check`` is not needed here (the backend checks the filled request against the same bounds); ``admit`` (the
        rate limit) runs before the request leaves, and ``refund`` when the backend turns it away without running
        it. A request the backend finds no room for (503) is tried once more a second later before the refusal is
        passed on. ``step_callback(step, steps, None)`` follows the backend's steps (no latents cross the wire: no
        previews); ``chunk_callback`` is not used (the growing video of an autoregressive model stays local-only).
        Once ``cancel`` is set, the stream is closed and the backend stops the run at its next step."""
        if getattr(request, "image", None) is not None or getattr(request, "true_cfg_scale", None) is not None:
            raise InvalidRequestError("kinegen serve takes text prompts only (no input image or true_cfg_scale); use "
                                      "`kinegen app` or `kinegen generate` for those.")
        body = {"model": model, "prompt": request.prompt, "negative_prompt": request.negative_prompt,
                "height": request.height, "width": request.width, "frames": request.frames, "steps": request.steps,
                "guidance": request.guidance, "seed": int(request.seed), "accelerators": list(accelerators),
                "compare": bool(compare), "output": "bytes", "stream": True}
        if admit is not None:
            admit()
        for attempt in (1, 2):
            try:
                return self._send(body, step_callback, cancel)
            except BackendBusy:
                # Ray counts requests it has not yet placed on a replica as queued, so a burst can find the queue
                # "full" for an instant while a replica is about to be free: one more try, a second later.
                if attempt == 1 and not (cancel is not None and cancel.is_set()):
                    time.sleep(BUSY_RETRY_S)
                    continue
                if refund is not None:
                    refund()
                raise
            except KinegenError as e:
                if refund is not None and getattr(e, "refused", False):
                    refund()  # turned away before it ran: it does not count against the user's rate limit
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, body: dict[str, Any], step_callback, cancel: threading.Event | None) -> RunOutput:
        """One ``POST /generate`` (streamed); its result, or the backend's error as a KinegenError (``refused`` set
        when the backend turned the request away without running it)."""
        import httpx

        try:
            with self._http.stream("POST", f"{self.url}/generate", json=body) as resp:
                if resp.status_code != 200:
                    resp.read()
                    try:
                        err = resp.json()
                    except ValueError:
                        err = {"error": resp.text[:300]}
                    if resp.status_code == 401:
                        e = self._token_refused(err.get("error") or "")
                        e.refused = True  # not run: it does not count against the user's rate limit
                        raise e
                    raise self._error(resp.status_code, err.get("error") or str(err),
                                      refused=resp.status_code in (400, 404, 413, 503))
                for line in resp.iter_lines():
                    if cancel is not None and cancel.is_set():  # closing the stream cancels the run on the backend
                        raise RunCancelled("The run was cancelled; nothing was written.")
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    kind = ev.get("event")
                    if kind == "step" and step_callback is not None:
                        step_callback(ev["step"] - 1, ev["steps"], None)  # as run_job's: the index
                    elif kind == "retry":
                        log.warning("backend: %s", ev.get("message"))
                    elif kind == "error":
                        raise self._error(int(ev.get("status", 500)), ev.get("message", "unknown error"),
                                          refused=bool(ev.get("refused")))
                    elif kind == "result":
                        return self._output(ev)
        except httpx.HTTPError as e:
            raise self._unavailable(e) from None
        raise BackendError(f"The backend at {self.url} closed the stream without a result; the run may have been "
                           "stopped. Try again.")

    def _error(self, status: int, message: str, refused: bool = False) -> KinegenError:
        if status == 503:
            e: KinegenError = BackendBusy(message)
        elif status in (400, 404, 413, 422):
            e = InvalidRequestError(message)
        else:
            e = BackendError(message)
        e.refused = refused
        return e

    def _output(self, ev: dict[str, Any]) -> RunOutput:
        request = request_from_dict(ev["request"])
        result = _result(ev, request)
        dense = _result({"kind": result.kind, **ev["dense"]}, request) if ev.get("dense") else None
        extra = {"replica": ev.get("replica"), "replica_pid": ev.get("replica_pid"), "attempts": ev.get("attempts", 1),
                 "queue_s": ev.get("queue_s"), "backend_run_s": ev.get("run_s")}
        return RunOutput(result=result, dense=dense, psnr_db=ev.get("psnr_db"), extra=extra)

    def close(self) -> None:
        self._http.close()


__all__ = ["BackendBusy", "BackendError", "BackendUnavailable", "RemoteResult", "RemoteRunner"]
