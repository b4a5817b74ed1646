"""DASA (Dynamics-Aware Sparse Attention) for chunk-by-chunk video (docs/dasa.md; issue 21).

* :mod:`.config`: :class:`DASAConfig`, the settings;
* :mod:`.dynamics`: per-token dynamics from latent differences, EMA + hysteresis, keyframes;
* :mod:`.kv`: which tokens of a committed chunk the KV cache keeps, and the spans their bias comes from;
* :mod:`.sparse`: block-sparse attention for static queries on :mod:`kinegen.sparse_attn`'s executors;
* :mod:`.processor`: the self-attention processor (compressing commit, skipped tokens, sparse queries);
* :mod:`.run`: one run's chunk hook and transformer hooks (region compute allocation);
* :mod:`.apply`: :func:`apply_dasa`, registered as the attention accelerator ``dasa``.
"""

from .apply import apply_dasa, dasa_stats
from .config import COMPUTE_MODES, DASAConfig

__all__ = ["COMPUTE_MODES", "DASAConfig", "apply_dasa", "dasa_stats"]
