"""Networks Kinegen owns (tiny test models now; the MP-GAN, Map Predictor and evaluators later)."""
