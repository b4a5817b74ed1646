"""Applications on top of the library: the Gradio web app (``kinegen app``)."""

from .service import AppConfig, RateLimiter, Service

__all__ = ["AppConfig", "RateLimiter", "Service"]
