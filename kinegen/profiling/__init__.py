"""Profiling, built on generation: fidelity metrics, the side-by-side profiler and its report."""
