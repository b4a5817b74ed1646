"""Networks Kinegen owns: tiny test pipelines (``tiny``), the bundled text-to-video model's parts
(``shapes_t2v``), the MP-GAN (``mpgan``, its settings in ``mpgan_config``), the Map Predictor
(``map_predictor``) and the evaluators' classifiers (``adherence``, ``gan_classifier``)."""
