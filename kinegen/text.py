"""Small text helpers shared by every entry point: one true/false parser, one output-name slug, JSON-safe values,
accelerator stats and settings for people, and reading a user's small text file with errors that say what to do."""

from __future__ import annotations

import re

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(text: str) -> bool:
    """``true/yes/on/1`` -> True, ``false/no/off/0`` -> False (any case); ValueError otherwise."""
    low = str(text).strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def env_flag(name: str, default: bool = False) -> bool:
    """An environment variable read as true/false with the same words as :func:`parse_bool` (unset or
    unrecognised: ``default``); Hugging Face reads ``HF_HUB_OFFLINE`` with these words too."""
    import os

    value = os.environ.get(name, "").strip().lower()
    return True if value in TRUE_WORDS else False if value in FALSE_WORDS else default


def json_safe(obj):
    """``obj`` with every non-finite float as a string (``"inf"``, ``"nan"``), for strict JSON: an infinite
    setting (``max_error=inf``) or stat must not cost a whole report."""
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def slug(text: str, max_len: int = 48) -> str:
    """A file-name-safe stem from free text: ``"A red circle!"`` -> ``"a-red-circle"`` (``"output"`` if empty)."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")[:max_len].strip("-") or "output"


def stat_items(stats: dict) -> list[tuple[str, str]]:
    """An accelerator's scalar stats as ``(name, text)`` pairs for people: floats to 3 significant digits; the
    name, the settings, the warning (each shown apart), lists, dicts and unset values left out."""
    return [(k, f"{v:.3g}" if isinstance(v, float) else str(v)) for k, v in stats.items()
            if k not in ("name", "config", "warning") and v is not None and not isinstance(v, (list, dict))]


def settings_text(config: dict) -> str:
    """An accelerator's settings as a spec would write them (``reuse=residual,map=auto``; unset ones left out)."""
    def text(v) -> str:
        return str(v).lower() if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)

    return ",".join(f"{k}={text(v)}" for k, v in config.items() if v is not None and v != "")


def read_user_text(path, flag: str, expect: str) -> str:
    """The UTF-8 text of the file a user named with ``flag``; a :class:`~kinegen.errors.ConfigError` saying what to
    give (``expect``, e.g. "a text file of USER:PASSWORD lines"; "a readable ..." when it cannot be read) when it
    is missing, a folder or unreadable."""
    from pathlib import Path

    from .errors import ConfigError

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{flag} {path} {'is a folder' if path.is_dir() else 'does not exist'}; give {expect}.")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = "it is not UTF-8 text" if isinstance(e, UnicodeDecodeError) else e.strerror or type(e).__name__
        raise ConfigError(f"{flag} {path} cannot be read ({why}); give a readable "
                          f"{expect.removeprefix('a ')}.") from None
