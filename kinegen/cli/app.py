"""``kinegen app``: start the Gradio web app (Generate, GAN, Profile, History) and its generate API,
with a queue, a rate limit and optional logins from ``--auth``/``--auth-file``."""

from __future__ import annotations

import logging
from pathlib import Path


def add_parser(subparsers) -> None:
    from ..registry import DEFAULT_APP_MODELS

    app = subparsers.add_parser(
        "app", help="start the web UI (Generate, GAN, Profile, History) and its API",
        description="Start the Gradio web app. Models load once and are reused; runs go through a queue with "
                    "--concurrency runs at a time and at most --max-queue waiting; outputs are written to "
                    "--output-dir, the only folder the server serves files from. The generate function is also "
                    "an API endpoint: gradio_client's Client(URL).predict(prompt=..., seed=..., "
                    "api_name=\"/generate\") returns the video file.",
        epilog="Example: kinegen app --port 7860 --auth alice:secret --rate-limit 6")
    app.add_argument("--host", default="127.0.0.1",
                     help="interface to listen on; 0.0.0.0 for every interface (default: %(default)s)")
    app.add_argument("--port", type=int, default=7860, help="port (default: %(default)s)")
    app.add_argument("--models", nargs="+", metavar="M", default=list(DEFAULT_APP_MODELS),
                     help="text-to-video/image models to offer: registry names or local diffusers folders "
                          "(default: %(default)s)")
    app.add_argument("--gan-models", nargs="*", metavar="M", default=["kinegen-shapes-gan"],
                     help="class-conditional GANs for the GAN tab (default: %(default)s; --gan-models with no "
                          "names hides the tab)")
    app.add_argument("--omni-models", nargs="*", metavar="M", default=None,
                     help="omni models for the Understand tab: kinegen-shapes-omni or folders from `kinegen train "
                          "omni` (default: the bundled one where it is installed; --omni-models with no names hides "
                          "the tab)")
    app.add_argument("--output-dir", default="kinegen-app-outputs", metavar="DIR",
                     help="where outputs and history.jsonl are written (default: %(default)s)")
    app.add_argument("--concurrency", type=int, default=1, metavar="N",
                     help="runs executing at once on the device (default: %(default)s)")
    app.add_argument("--max-queue", type=int, default=16, metavar="N",
                     help="runs that may wait in the queue; more are refused (default: %(default)s)")
    app.add_argument("--rate-limit", type=int, default=0, metavar="N",
                     help="runs per user per minute, 0 = unlimited (default: %(default)s)")
    app.add_argument("--auth", action="append", metavar="USER:PASSWORD",
                     help="require a login (repeat for several users); see also --auth-file")
    app.add_argument("--auth-file", metavar="FILE", help="a file of USER:PASSWORD lines")
    app.set_defaults(func=run)


def read_auth(args) -> list[tuple[str, str]] | None:
    """``--auth`` values and ``--auth-file`` lines (blank lines and ``#`` comments skipped) as pairs."""
    from ..errors import ConfigError

    lines = list(args.auth or [])
    if args.auth_file:
        from ..text import read_user_text

        text = read_user_text(args.auth_file, "--auth-file", "a text file of USER:PASSWORD lines")
        lines += [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    pairs = []
    for line in lines:
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise ConfigError("--auth takes USER:PASSWORD with both parts non-empty.")
        pairs.append((user, password))
    return pairs or None


def run(args) -> int:
    from ..apps.service import AppConfig
    from ..apps.web import launch_app
    from ..errors import ConfigError
    from ..loading import resolve_model

    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 1 and 65535; got {args.port}.")
    if Path(args.output_dir).exists() and not Path(args.output_dir).is_dir():
        raise ConfigError(f"--output-dir {args.output_dir} is a file; give a folder for the outputs.")
    for flag, names, gan in (("--models", args.models, False), ("--gan-models", args.gan_models, True)):
        for m in names:
            spec = resolve_model(m).spec  # unknown names and incomplete folders fail here, before the server starts
            if spec is not None and (spec.adapter.conditioning == "class") != gan:
                other = "--models" if gan else "--gan-models"
                raise ConfigError(f"{flag} {m}: it is {'not ' if gan else ''}a class-conditional GAN; give it "
                                  f"with {other}.")
    from ..pipelines.omni_understand import default_omni_models, resolve_omni_folder

    omni = default_omni_models() if args.omni_models is None else list(args.omni_models)
    for m in omni:
        resolve_omni_folder(m)  # an unknown name or a folder without a thinker: refused before the server starts
    config = AppConfig(models=list(args.models), gan_models=list(args.gan_models), omni_models=omni,
                       output_dir=Path(args.output_dir),
                       concurrency=args.concurrency, max_queue=args.max_queue, rate_limit=args.rate_limit,
                       auth=read_auth(args))
    print(f"Kinegen app on http://{args.host}:{args.port}/ (outputs in {config.output_dir.resolve()}); Ctrl+C stops it",
          flush=True)
    # The operator's log (Kinegen's loggers only; not the HTTP libraries' request lines): one line per refused
    # request, a traceback only for a failure that is a bug.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger("kinegen").addHandler(handler)
    logging.getLogger("kinegen").setLevel(logging.INFO)
    launch_app(config, host=args.host, port=args.port)
    return 0
