"""Accelerators: the leaf base every accelerator builds on, and the catalogue of the built-in ones.

- :mod:`kinegen.accelerators.base` (a leaf: it imports nothing of Kinegen's but errors and text
  helpers): :class:`RunInfo`, :class:`AcceleratorHandle`, the registry (:func:`register_accelerator`),
  spec parsing and the per-guidance-branch :class:`StepTracker`. Accelerator packages
  (:mod:`kinegen.caching`, :mod:`kinegen.sparse_attn`) import it and register themselves.
- :mod:`kinegen.accelerators.catalog` imports those packages (so every built-in accelerator is
  registered) and offers :func:`~kinegen.accelerators.catalog.accelerate`, ``parse_spec``,
  ``get_accelerator`` and ``list_accelerators``. It sits above the packages; nothing below imports it.
"""

from .base import AcceleratorHandle, RunInfo, StepTracker, register_accelerator

__all__ = ["AcceleratorHandle", "RunInfo", "StepTracker", "register_accelerator"]
