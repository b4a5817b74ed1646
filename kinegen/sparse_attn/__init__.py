"""Attention accelerators: dense backends selectable by name (and, later, HyperVAttention and its baseline)."""
