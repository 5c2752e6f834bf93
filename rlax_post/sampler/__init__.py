"""Sampling: batched KV-cache decoding (v0). The JetStream engine and RL driver replace it ([sampler])."""

from rlax_post.sampler._v0 import generate
from rlax_post.sampler._v0 import Generation
from rlax_post.sampler._v0 import sample_token

__all__ = ["generate", "Generation", "sample_token"]
