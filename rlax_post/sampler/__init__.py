"""Sampling: the JetStream engine over our models, its serving, and batched KV-cache decoding (v0).

`RlaxEngine` implements JetStream's `Engine` API (prefill with bucketed lengths and prefix extension,
insert into slots, one decode step for all slots); `rlax-post serve` runs JetStream's gRPC server with it.
`Driver` is the RL sampling driver over the engine (continuous batching, shared prefills, parameter versions,
multi-turn continuation). The synchronous training loop still samples with `generate` (v0) until it is
switched to the driver ([sampler]).
"""

from rlax_post.sampler._driver import Completion
from rlax_post.sampler._driver import Driver
from rlax_post.sampler._driver import DriverStats
from rlax_post.sampler._driver import Request
from rlax_post.sampler._engine import DecodeState
from rlax_post.sampler._engine import Prefix
from rlax_post.sampler._engine import RlaxEngine
from rlax_post.sampler._tokenizer_api import ByteTokenizerAdapter
from rlax_post.sampler._tokenizer_api import prefill_buckets
from rlax_post.sampler._v0 import generate
from rlax_post.sampler._v0 import Generation
from rlax_post.sampler._v0 import sample_token

__all__ = [
    "ByteTokenizerAdapter",
    "Completion",
    "Driver",
    "DriverStats",
    "Request",
    "DecodeState",
    "generate",
    "Generation",
    "prefill_buckets",
    "Prefix",
    "RlaxEngine",
    "sample_token",
]
