"""Errors that Kinegen raises on bad input.

Every error carries a message that says what went wrong *and what to do*. The CLI
prints ``str(error)`` without a traceback and exits with status 2; the web UI shows
it in the page. Anything else that escapes is a bug.
"""

from __future__ import annotations


class KinegenError(Exception):
    """Base class: a user-facing error with an actionable message."""


class ModelNotFoundError(KinegenError):
    """A model name, folder or hub id could not be resolved to a complete pipeline folder."""


class IncompleteModelFolderError(ModelNotFoundError):
    """A diffusers folder exists but lacks model_index.json or a component's files."""

    def __init__(self, folder: str, missing: list[str], hint: str = ""):
        self.folder = folder
        self.missing = list(missing)
        lines = [f"The model folder {folder} is incomplete; missing:"]
        lines += [f"  - {m}" for m in self.missing]
        if hint:
            lines.append(hint)
        super().__init__("\n".join(lines))


class UnsupportedModelError(KinegenError):
    """A transformer class has no model-family adapter."""


class InvalidRequestError(KinegenError, ValueError):
    """A generation request (size, frames, steps, prompt, output path, ...) is invalid."""


class ConfigError(KinegenError, ValueError):
    """An accelerator spec ``name:key=value,...`` names an unknown accelerator or key, or a bad value."""


class FidelityWarning(UserWarning):
    """An accelerator served a request differently from how it was asked, to keep the output intact (for
    example a caching speedup lowered to the fidelity bound); the message says what was done."""


class PromptWarning(UserWarning):
    """The prompt has words the model's tokenizer cannot read (they become its unknown token), so the output will
    not follow them; the message names them."""


class CorruptModelFileError(ModelNotFoundError):
    """A model folder is complete, but a weights file in it is truncated or corrupt."""


class DiskFullError(KinegenError):
    """The disk filled while an output was being written (the earlier file at that path is untouched)."""


class OutOfMemory(KinegenError):
    """A run or a load ran out of GPU (or CPU) memory; what could be freed has been freed."""


class RunCancelled(KinegenError):
    """A run was stopped before it finished (the app's Stop, or its client went away); nothing was written."""
