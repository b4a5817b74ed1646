"""``kinegen serve``: many users. A Ray Serve backend runs the generation pipeline in replicas (one loaded model per
replica: one per GPU, or a set number on CPU) behind an HTTP API with health checks and a bounded queue; the Gradio
front end (the same page as ``kinegen app``) is its own process and sends each generation to that API.

- :mod:`kinegen.serve.protocol`: the HTTP API's request and response models and their validation (no Ray);
- :mod:`kinegen.serve.worker`: one replica's work, without Ray (load the model, run, encode the output);
- :mod:`kinegen.serve.client`: :class:`~kinegen.serve.client.RemoteRunner`, the front end's runner that calls the
  backend over HTTP (no Ray);
- :mod:`kinegen.serve.backend`: the Ray Serve deployments (replicas and the FastAPI ingress); imports Ray;
- :mod:`kinegen.serve.launch`: starting the backend, the front end and the supervisor that watches them.

The backend's API takes a shared token (``--backend-token-file`` or ``KINEGEN_BACKEND_TOKEN``; ``kinegen serve``
makes a random one and hands it to its front end through the environment): every path but ``/health`` needs
``Authorization: Bearer TOKEN``.

Ray is an optional extra (``pip install "kinegen[serve]"``); only the backend needs it. ``kinegen app`` stays the
single-process server.
"""

from __future__ import annotations

RAY_MISSING = ('kinegen serve runs its backend on Ray Serve, which is not installed here: pip install '
               '"kinegen[serve]" (or pip install "ray[serve]>=2.60"). Without it, `kinegen app` serves the same page '
               'from one process; `kinegen serve --frontend-only --backend URL` needs no Ray either.')


def require_ray() -> None:
    """Raise a :class:`~kinegen.errors.ConfigError` that says what to install when Ray Serve is missing."""
    from ..errors import ConfigError

    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        raise ConfigError(RAY_MISSING) from None


__all__ = ["RAY_MISSING", "require_ray"]
