"""Starting ``kinegen serve``: the Ray Serve backend, the Gradio front end (its own process), and the supervisor that
starts the front end once the backend is healthy, keeps watching both, and stops both on Ctrl+C; and the backend's
token (:func:`backend_token`), which both halves get from their environment or a file, never from a command line.

Ray is imported only in :func:`start_backend` and :func:`stop_backend`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .protocol import TOKEN_ENV, check_token

log = logging.getLogger("kinegen.serve")

AUTH_ENV = "KINEGEN_SERVE_AUTH"  # the logins, handed to the front end's process (not on its command line)


@dataclasses.dataclass
class BackendSettings:
    """How the backend runs (``kinegen serve --help`` sets these)."""

    models: list[str]
    replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    max_queue: int = 16
    host: str = "127.0.0.1"
    port: int = 8000
    output_dir: Path = Path("kinegen-app-outputs")
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    token: str | None = dataclasses.field(default=None, repr=False)  # required on every path but /health
    token_made: bool = False  # the token is a random one made by kinegen serve for its own page

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    @property
    def threads(self) -> int | None:
        """torch's CPU threads per replica: its CPUs (on a GPU, torch's default)."""
        return None if self.gpus_per_replica else max(1, int(self.cpus_per_replica))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def read_token_file(path) -> str:
    """The first line of ``path`` (surrounding spaces stripped), checked as a token."""
    from ..text import read_user_text

    text = read_user_text(path, "--backend-token-file", "a text file whose first line is the token")
    lines = text.splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise ConfigError(f"--backend-token-file {path}: its first line is empty; put the token there.")
    return check_token(token, f"--backend-token-file {path}")


def backend_token(token_file=None, environ=None) -> str | None:
    """The backend's token: the first line of ``token_file`` if given, else ``$KINEGEN_BACKEND_TOKEN`` if set and not
    empty, else None."""
    if token_file:
        return read_token_file(token_file)
    text = (os.environ if environ is None else environ).get(TOKEN_ENV, "").strip()
    return check_token(text, f"the environment variable {TOKEN_ENV}") if text else None


def new_token() -> str:
    """A random token (``kinegen serve`` makes one for its own page when none is given)."""
    return secrets.token_urlsafe(32)


def default_replicas() -> tuple[int, float, float]:
    """``(replicas, cpus_per_replica, gpus_per_replica)`` for this machine: one replica per GPU; on a CPU-only
    machine one replica with every core."""
    import torch

    cpus = os.cpu_count() or 1
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        return gpus, max(1.0, float(cpus // max(gpus, 1))), 1.0
    return 1, float(cpus), 0.0


def check_resources(s: BackendSettings, total_replicas: int | None = None, cpus: int | None = None,
                    gpus: int | None = None) -> None:
    """Refuse settings this machine cannot place (Ray would otherwise wait for resources forever).
    ``total_replicas``: over every model (default: ``s.replicas`` times the models)."""
    if cpus is None:
        cpus = os.cpu_count() or 1
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if s.replicas < 1 or s.max_queue < 1:
        raise ConfigError("--replicas and --max-queue must be at least 1.")
    if s.cpus_per_replica <= 0 or s.gpus_per_replica < 0:
        raise ConfigError("--cpus-per-replica must be above 0 and --gpus-per-replica 0 or more.")
    n = total_replicas or s.replicas * len(s.models)
    each = f" ({n} replicas: {s.replicas} of each of {len(s.models)} models)" if len(s.models) > 1 else ""
    if n * s.cpus_per_replica > cpus + 1e-9:
        raise ConfigError(f"{n} replicas x {s.cpus_per_replica:g} CPUs = {n * s.cpus_per_replica:g} CPUs{each}, but "
                          f"this machine has {cpus}; lower --replicas or --cpus-per-replica (a fraction such as 0.5 "
                          "lets replicas share a core, taking turns).")
    if n * s.gpus_per_replica > gpus + 1e-9:
        raise ConfigError(f"{n} replicas x {s.gpus_per_replica:g} GPUs needs {n * s.gpus_per_replica:g} GPUs{each}; "
                          f"this machine has {gpus}. Lower --replicas, or --gpus-per-replica 0 to run on the CPU.")


def start_backend(s: BackendSettings) -> str:
    """Start Ray (on this machine), Serve's HTTP proxy on ``s.host:s.port`` and the application; returns its URL
    once every replica has loaded its model."""
    from . import require_ray

    require_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no calls home from a private server
    import ray
    from ray import serve

    from .backend import APP_NAME, build_application

    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=True)
    log.info("Ray started (%s); loading %d replica(s) of %s", ray.get_runtime_context().gcs_address, s.replicas,
             ", ".join(s.models))
    serve.start(http_options={"host": s.host, "port": s.port})
    app = build_application(s.models, replicas=s.replicas, cpus_per_replica=s.cpus_per_replica,
                            gpus_per_replica=s.gpus_per_replica, max_queue=s.max_queue, limits=s.limits,
                            output_dir=str(Path(s.output_dir).resolve()), threads=s.threads, token=s.token)
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    return s.url


def stop_backend() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def http_json(url: str, timeout: float = 10.0, token: str | None = None) -> tuple[int, dict[str, Any]]:
    """``GET url`` (with ``token`` as ``Authorization: Bearer``) as (status, JSON body); (0, {"error": ...}) when
    nothing answers."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {}
    except (OSError, ValueError) as e:
        return 0, {"error": str(e)}


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    """Wait until ``url`` answers 200 (False after ``timeout_s``, or when ``proc`` exits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(1.0)
    return False


def frontend_command(backend_url: str, args) -> list[str]:
    """The front end's command line (its logins and the backend's token travel in the environment, not here)."""
    cmd = [sys.executable, "-m", "kinegen.cli", "serve", "--frontend-only", "--backend", backend_url,
           "--host", args.host, "--port", str(args.port), "--output-dir", str(args.output_dir),
           "--rate-limit", str(args.rate_limit), "--max-queue", str(args.max_queue)]
    if args.concurrency:
        cmd += ["--concurrency", str(args.concurrency)]
    return cmd


def _stop_on_sigterm(_signum, _frame):
    raise KeyboardInterrupt  # the same clean stop as Ctrl+C


def frontend_env(auth: list[tuple[str, str]] | None, token: str | None, environ=None) -> dict[str, str]:
    """The front end's environment: this process's, with the logins and the backend's token (or none: a token
    inherited from this process's environment is removed, since the backend does not use it)."""
    env = dict(os.environ if environ is None else environ)
    env.pop(AUTH_ENV, None)
    env.pop(TOKEN_ENV, None)
    if auth:
        env[AUTH_ENV] = json.dumps(auth)
    if token:
        env[TOKEN_ENV] = token
    return env


def supervise(settings: BackendSettings, args, auth: list[tuple[str, str]] | None, check_every_s: float = 5.0,
              max_restarts: int = 5) -> int:
    """``kinegen serve``: the backend, then the front end once the backend is healthy; then watch both (Serve
    replaces dead or unhealthy replicas itself; a front end that exits is started again, up to ``max_restarts``
    times) until Ctrl+C or SIGTERM, which stop both. The front end gets ``settings.token`` in its environment."""
    frontend: subprocess.Popen | None = None
    previous = signal.getsignal(signal.SIGTERM)
    try:
        url = start_backend(settings)
        signal.signal(signal.SIGTERM, _stop_on_sigterm)  # after ray.init, which installs a handler of its own
        if not wait_http(f"{url}/health", 120):
            raise ConfigError(f"The backend at {url} did not report healthy within 120 s; see the log above.")
        http_json(f"{url}/models", timeout=300, token=settings.token)  # the model list; the handles warmed up
        env = frontend_env(auth, settings.token)
        cmd = frontend_command(url, args)
        frontend = subprocess.Popen(cmd, env=env)
        front_url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}/"
        if not wait_http(front_url, 180, frontend):
            raise ConfigError(f"The front end did not start on {front_url}; see the log above.")
        print(f"Kinegen serve: the page on {front_url} (outputs in {Path(args.output_dir).resolve()}); the backend "
              f"on {url}/ ({settings.replicas} replica(s) of {', '.join(settings.models)}; POST /generate, GET "
              f"/health, GET /models{_token_note(settings)}). Ctrl+C stops both.", flush=True)
        restarts, healthy = 0, True
        while True:
            time.sleep(check_every_s)
            if frontend.poll() is not None:
                if restarts >= max_restarts:
                    log.error("the front end exited %d times; stopping", restarts + 1)
                    return 1
                restarts += 1
                log.warning("the front end exited with %s; starting it again (%d/%d)", frontend.returncode,
                            restarts, max_restarts)
                frontend = subprocess.Popen(cmd, env=env)
            code, body = http_json(f"{url}/health", timeout=10, token=settings.token)
            now_healthy = code == 200 and body.get("status") == "ok"
            if now_healthy != healthy:
                log.warning("backend %s: %s", "healthy again" if now_healthy else "not healthy",
                            json.dumps(body.get("models", body)))
                healthy = now_healthy
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if frontend is not None and frontend.poll() is None:
            frontend.terminate()
            try:
                frontend.wait(15)
            except subprocess.TimeoutExpired:
                frontend.kill()
        try:
            stop_backend()
        except Exception:  # noqa: BLE001 (Ray may already be down; nothing else to stop)
            log.debug("stopping the backend", exc_info=True)


def _token_note(settings: BackendSettings) -> str:
    """How a caller of the API gets past the token (never the token itself: the log may be shared)."""
    if not settings.token:
        return "; no token: keep it on this machine"
    if settings.token_made:
        return (f"; its token is a random one for the page: to call the API yourself, give one with "
                f"--backend-token-file FILE or {TOKEN_ENV}")
    return "; send the token given as 'Authorization: Bearer TOKEN'"


def run_backend_only(settings: BackendSettings) -> int:
    """``kinegen serve --backend-only``: the backend alone, until Ctrl+C or SIGTERM."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        url = start_backend(settings)
        signal.signal(signal.SIGTERM, _stop_on_sigterm)  # after ray.init, which installs a handler of its own
        wait_http(f"{url}/health", 120)
        http_json(f"{url}/models", timeout=300, token=settings.token)
        same = " with the same token (--backend-token-file or the environment)" if settings.token else ""
        print(f"Kinegen serve backend on {url}/ ({settings.replicas} replica(s) of {', '.join(settings.models)}"
              f"{_token_note(settings)}); front ends: kinegen serve --frontend-only --backend {url}{same}. Ctrl+C "
              "stops it.", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            stop_backend()
        except Exception:  # noqa: BLE001
            log.debug("stopping the backend", exc_info=True)


def frontend_config(runner, *, output_dir: Path, rate_limit: int, max_queue: int, concurrency: int | None,
                    auth: list[tuple[str, str]] | None):
    """The front end's :class:`~kinegen.apps.service.AppConfig`: the backend's models and bounds; Gradio passes up
    to ``concurrency`` runs to the backend at once (default: its replicas plus its queue, so the backend's router
    places them and its bounded queue is the one that waits) and lets ``max_queue`` more wait in the page's queue."""
    from ..apps.service import AppConfig

    info = runner.info()
    if not info["models"]:
        raise ConfigError(f"The backend at {runner.url} offers no models.")
    limits = {k: v for k, v in info["limits"].items() if k in ("max_side", "max_frames", "max_steps",
                                                               "max_prompt_chars")}
    return AppConfig(models=[m["name"] for m in info["models"]], gan_models=[], output_dir=output_dir,
                     concurrency=concurrency or info["replicas"] + info["max_queue"], max_queue=max_queue,
                     rate_limit=rate_limit, auth=auth, **limits)


def run_frontend(backend_url: str, *, host: str, port: int, output_dir: Path, rate_limit: int, max_queue: int,
                 concurrency: int | None, auth: list[tuple[str, str]] | None, token: str | None = None,
                 wait_s: float = 300.0, prevent_thread_lock: bool = False):
    """``kinegen serve --frontend-only``: the app's page, its generations sent to the backend at ``backend_url``
    (with ``token``, the backend's, when it has one)."""
    from ..apps.service import Service
    from ..apps.web import launch_app
    from .client import RemoteRunner

    runner = RemoteRunner(backend_url, token=token)
    runner.wait_ready(wait_s)
    config = frontend_config(runner, output_dir=output_dir, rate_limit=rate_limit, max_queue=max_queue,
                             concurrency=concurrency, auth=auth)
    service = Service(config, runner=runner)
    print(f"Kinegen front end on http://{host}:{port}/ for the backend {runner.url} (models: "
          f"{', '.join(config.models)}; up to {config.concurrency} runs passed on at once, {config.max_queue} more "
          "waiting here)", flush=True)
    return launch_app(config, host=host, port=port, service=service, prevent_thread_lock=prevent_thread_lock)


def auth_from_env() -> list[tuple[str, str]]:
    """The logins ``kinegen serve`` handed to its front end."""
    text = os.environ.get(AUTH_ENV)
    if not text:
        return []
    try:
        return [(str(u), str(p)) for u, p in json.loads(text)]
    except (ValueError, TypeError):
        raise ConfigError(f"{AUTH_ENV} must be a JSON list of [user, password] pairs.") from None


__all__ = ["BackendSettings", "auth_from_env", "backend_token", "check_resources", "default_replicas",
           "frontend_config", "frontend_env", "is_loopback", "new_token", "run_backend_only", "run_frontend",
           "start_backend", "supervise"]
