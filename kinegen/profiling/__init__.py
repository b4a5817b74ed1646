"""Profiling: stage timers, fidelity metrics, the side-by-side profiler and its report."""
