"""``kinegen serve``: the web app for many users. A Ray Serve backend runs the generation pipeline in replicas (one
per GPU, or a set number on CPU) behind an HTTP API with health checks and a bounded queue; the Gradio page (the
same as ``kinegen app``'s, with the same logins and rate limit) is its own process and sends generations to it.
The backend's API takes a shared token (``--backend-token-file`` or ``KINEGEN_BACKEND_TOKEN``; made at random when
both halves start together). Ray is an optional extra: ``pip install "kinegen[serve]"``."""

from __future__ import annotations

import logging
import os
from pathlib import Path


def add_parser(subparsers) -> None:
    from ..registry import DEFAULT_MODEL

    p = subparsers.add_parser(
        "serve", help="serve many users: Ray Serve replicas of the pipeline behind the web UI (kinegen[serve])",
        description="Start a Ray Serve backend (--replicas replicas of each model, each with its own loaded "
                    "pipeline, health checks, a bounded queue of --max-queue requests per model) and the Gradio page "
                    "as its own process talking to it over HTTP. `kinegen app` is the single-process server; use "
                    "`serve` when one model copy is not enough (several GPUs, or several CPU replicas). The backend's "
                    "API: POST /generate, GET /health, GET /models (docs/scale_out.md); every path but /health needs "
                    "the header 'Authorization: Bearer TOKEN' when the backend has a token (--backend-token-file or "
                    "$KINEGEN_BACKEND_TOKEN; without either, kinegen serve makes a random one and hands it to its "
                    "page). Needs Ray for the backend: pip install \"kinegen[serve]\".",
        epilog="Examples: kinegen serve --replicas 2 --cpus-per-replica 1 | kinegen serve --backend-only "
               "--backend-host 10.0.0.5 --backend-token-file token.txt | kinegen serve --frontend-only --backend "
               "http://10.0.0.5:8000 --backend-token-file token.txt --auth alice:pw")
    front = p.add_argument_group("the page (as for kinegen app)")
    front.add_argument("--host", default="127.0.0.1",
                       help="interface the page listens on; 0.0.0.0 for every interface (default: %(default)s)")
    front.add_argument("--port", type=int, default=7860, help="the page's port (default: %(default)s)")
    front.add_argument("--output-dir", default="kinegen-app-outputs", metavar="DIR",
                       help="where the page writes outputs and history.jsonl, and the backend the outputs of API "
                            "requests with \"output\": \"path\" (default: %(default)s)")
    front.add_argument("--rate-limit", type=int, default=0, metavar="N",
                       help="runs per user per minute, 0 = unlimited (default: %(default)s)")
    front.add_argument("--auth", action="append", metavar="USER:PASSWORD",
                       help="require a login on the page (repeat for several users); see also --auth-file. Not for "
                            "--backend-only: the backend's API takes a token (--backend-token-file)")
    front.add_argument("--auth-file", metavar="FILE", help="a file of USER:PASSWORD lines for the page")
    front.add_argument("--concurrency", type=int, default=0, metavar="N",
                       help="runs the page passes to the backend at once (default: the backend's replicas plus its "
                            "--max-queue, so that the backend places them)")
    back = p.add_argument_group("the backend (Ray Serve)")
    back.add_argument("--models", nargs="+", metavar="M", default=[DEFAULT_MODEL],
                      help="text-to-video/image models, each a deployment of --replicas replicas (default: "
                           "%(default)s)")
    back.add_argument("--replicas", type=int, default=0, metavar="N",
                      help="replicas per model, each with its own copy of the model (default: one per GPU; 1 on a "
                           "CPU-only machine)")
    back.add_argument("--cpus-per-replica", type=float, default=0, metavar="C",
                      help="CPU cores reserved per replica, also its torch threads on CPU (default: the cores divided "
                           "among the replicas)")
    back.add_argument("--gpus-per-replica", type=float, default=-1, metavar="G",
                      help="GPUs per replica (default: 1 where there is a GPU, else 0)")
    back.add_argument("--max-queue", type=int, default=16, metavar="N",
                      help="requests that may wait for a replica, per model; more are refused at once with a message "
                           "(the page also keeps up to N waiting; with --frontend-only, only that) (default: "
                           "%(default)s)")
    back.add_argument("--backend-host", default="127.0.0.1",
                      help="interface of the backend's HTTP API; keep it on a private network. --backend-only on "
                           "anything but 127.0.0.1, ::1 or localhost needs a token (default: %(default)s)")
    back.add_argument("--backend-port", type=int, default=8000, help="the backend's port (default: %(default)s)")
    back.add_argument("--backend-token-file", metavar="FILE",
                      help="a file whose first line is the backend's token: the backend requires it as "
                           "'Authorization: Bearer TOKEN' on every path but /health, and --frontend-only sends it "
                           "(default: $KINEGEN_BACKEND_TOKEN; without either, kinegen serve makes a random one for "
                           "its page, and --backend-only runs without one, on loopback only)")
    mode = p.add_argument_group("running one half")
    only = mode.add_mutually_exclusive_group()
    only.add_argument("--frontend-only", action="store_true",
                      help="start only the page, for the backend at --backend (needs no Ray)")
    only.add_argument("--backend-only", action="store_true", help="start only the backend")
    mode.add_argument("--backend", metavar="URL", help="the backend for --frontend-only, e.g. http://127.0.0.1:8000")
    p.set_defaults(func=run)


def _log_to_console() -> None:
    """The operator's log: Kinegen's loggers only (one line per refused request, a traceback for a bug)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger("kinegen").addHandler(handler)
    logging.getLogger("kinegen").setLevel(logging.INFO)


def _check_common(args) -> None:
    from ..errors import ConfigError

    for flag, port in (("--port", args.port), ("--backend-port", args.backend_port)):
        if not 1 <= port <= 65535:
            raise ConfigError(f"{flag} must be between 1 and 65535; got {port}.")
    if Path(args.output_dir).exists() and not Path(args.output_dir).is_dir():
        raise ConfigError(f"--output-dir {args.output_dir} is a file; give a folder for the outputs.")
    if args.rate_limit < 0:
        raise ConfigError("--rate-limit must be 0 (off) or a positive number of runs per minute.")
    if args.max_queue < 1 or args.concurrency < 0:
        raise ConfigError("--max-queue must be at least 1 and --concurrency 0 (automatic) or more.")


def backend_settings(args):
    """The backend's settings from the flags, checked against the models and this machine's cores and GPUs."""
    from ..apps.service import AppConfig
    from ..errors import ConfigError
    from ..loading import resolve_model
    from ..serve.launch import BackendSettings, check_resources, default_replicas
    from ..serve.protocol import limits_of

    for m in args.models:
        spec = resolve_model(m).spec  # unknown names and incomplete folders fail here, before Ray starts
        if spec is not None and spec.adapter.conditioning == "class":
            raise ConfigError(f"--models {m}: it is a class-conditional GAN; kinegen serve serves text-to-video/image "
                              "models (the GAN tab is in `kinegen app`).")
    if len(set(args.models)) != len(args.models):
        raise ConfigError("--models lists a model twice; give each once (--replicas sets the copies).")
    replicas, _, gpus = default_replicas()
    replicas = args.replicas or replicas
    gpus = gpus if args.gpus_per_replica < 0 else args.gpus_per_replica
    total = replicas * len(args.models)  # every model is a deployment of its own replicas
    cpus = args.cpus_per_replica or float(max(1, (os.cpu_count() or 1) // total))
    settings = BackendSettings(models=list(args.models), replicas=replicas, cpus_per_replica=cpus,
                               gpus_per_replica=gpus, max_queue=args.max_queue, host=args.backend_host,
                               port=args.backend_port, output_dir=Path(args.output_dir),
                               limits=limits_of(AppConfig(models=list(args.models), gan_models=[])))
    check_resources(settings, total_replicas=total)
    return settings


def check_backend_only(args, token: str | None) -> None:
    """``--backend-only`` listens where others can reach it only with a token, and has no page to log in to."""
    from ..errors import ConfigError
    from ..serve.launch import is_loopback
    from ..serve.protocol import MAKE_TOKEN, TOKEN_ENV

    if args.auth or args.auth_file:
        raise ConfigError("--auth and --auth-file are the page's logins, and --backend-only starts no page: give them "
                          "to `kinegen serve --frontend-only`. The backend's API takes a token instead "
                          f"(--backend-token-file FILE or {TOKEN_ENV}).")
    if not token and not is_loopback(args.backend_host):
        raise ConfigError(f"--backend-only --backend-host {args.backend_host} without a token would let anyone who "
                          "can reach that address run generations. Give the backend a token: the first line of a file "
                          f"given with --backend-token-file FILE, or the environment variable {TOKEN_ENV} (make one "
                          f"with: {MAKE_TOKEN}), and the same to each `kinegen serve --frontend-only`. Or keep "
                          "--backend-host 127.0.0.1.")


def run(args) -> int:
    from ..errors import ConfigError
    from ..serve.launch import backend_token
    from .app import read_auth

    _check_common(args)
    token = backend_token(args.backend_token_file)  # the file, else $KINEGEN_BACKEND_TOKEN, else None
    if args.frontend_only:
        if not args.backend:
            raise ConfigError("--frontend-only needs --backend URL (the backend's address, e.g. "
                              "http://127.0.0.1:8000).")
        from ..serve.launch import auth_from_env, run_frontend

        auth = read_auth(args) or auth_from_env() or None
        _log_to_console()
        run_frontend(args.backend, host=args.host, port=args.port, output_dir=Path(args.output_dir),
                     rate_limit=args.rate_limit, max_queue=args.max_queue, concurrency=args.concurrency or None,
                     auth=auth, token=token)
        return 0
    if args.backend:
        raise ConfigError("--backend is for --frontend-only (this command starts its own backend).")
    if args.backend_only:
        check_backend_only(args, token)  # before Ray: a refusal costs nothing
    from ..serve import require_ray

    require_ray()  # before any model is resolved or loaded: say what to install
    settings = backend_settings(args)
    auth = read_auth(args)
    _log_to_console()
    from ..serve.launch import new_token, run_backend_only, supervise

    if args.backend_only:
        settings.token = token
        return run_backend_only(settings)
    # both halves: the given token, else a random one; the page gets it through its environment
    settings.token, settings.token_made = (token, False) if token else (new_token(), True)
    return supervise(settings, args, auth)
