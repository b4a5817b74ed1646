"""Caching accelerators: diffusers' built-in caches as peers (and, later, Map-Guided Caching)."""
