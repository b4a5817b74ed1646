"""Evaluators: what Kinegen measures about a model's outputs (``kinegen eval``).

- :mod:`.adherence`: prompt adherence of text-to-video models, the shape, colour and motion a
  classifier reads in each generated video (``kinegen eval adherence``);
- :mod:`.gan_metrics`: FD, KID, precision/recall, class accuracy and mode coverage of a class-conditional
  GAN on a bundled classifier's features (``kinegen eval gan``).

The classifier networks are in :mod:`kinegen.models` (``adherence``, ``gan_classifier``), their
training loops in :mod:`kinegen.training`.
"""
