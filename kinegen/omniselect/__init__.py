"""OmniSelect: training-free, modality-adaptive token pruning for audio-video LLMs (docs/omniselect.md).

>>> handle = apply_omniselect(thinker, OmniSelectConfig(keep=0.3))
>>> handle.set_relevance(estimator.score(frames, times, audio, sr, question))
>>> thinker.generate(**inputs)        # the prefill runs on 30% of the audio and video tokens
>>> handle.stats()["rows"][0]["regime"], handle.remove()
"""

from .apply import OmniSelectHandle, apply_omniselect
from .config import METHODS, OmniSelectConfig
from .relevance import HeuristicRelevance, RelevanceScores, question_keywords

__all__ = ["METHODS", "HeuristicRelevance", "OmniSelectConfig", "OmniSelectHandle", "RelevanceScores",
           "apply_omniselect", "question_keywords"]
