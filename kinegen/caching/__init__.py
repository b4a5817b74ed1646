"""Caching accelerators: Map-Guided Caching (ours: ``map_guided*.py``, ``planner.py``, ``tvmap.py``) and
diffusers' built-in caches as peers (``diffusers_caches.py``). Each module registers its accelerators with
:mod:`kinegen.accelerators.base` when imported; :mod:`kinegen.accelerators.catalog` imports them."""
