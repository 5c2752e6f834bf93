"""Sampling: the JetStream engine over our models, the RL driver on it, and serving.

`RlaxEngine` implements JetStream's `Engine` API (prefill with bucketed lengths and prefix extension,
insert into slots, one decode step for all slots) plus batched prefill and insert, blocks of decode steps per
host round trip (`generate_block`) and a sampling law per slot (`SamplingParams`); `rlax-post serve` runs
JetStream's orchestrator with it (at its options' `SamplingLaw`, the user's law and seed, as `generate`'s and
`evaluate`'s) behind a gRPC `Server` that rejects malformed requests (`check_request`) before they reach
JetStream's threads.
`Driver` is the RL sampling driver over the engine (continuous batching, shared prefills, parameter versions,
multi-turn continuation); the training loop and evaluation sample through it (one sampling path).
`run_episodes` runs multi-turn env episodes on a driver; `EpisodeRunner` streams groups of them.
`ScoreService` scores batches of token rows (or strings) with a scalar model (`models.sequence_values`):
jitted, sharded, length-bucketed, callable from several threads; a reward model's or a critic's queries.
"""

from rlax_post.sampler._driver import Driver
from rlax_post.sampler._engine import Block
from rlax_post.sampler._engine import CPU_KV_BLOCK
from rlax_post.sampler._engine import DecodeState
from rlax_post.sampler._episodes import END_REASONS
from rlax_post.sampler._episodes import EpisodeRunner
from rlax_post.sampler._episodes import Episode
from rlax_post.sampler._episodes import run_episodes
from rlax_post.sampler._requests import Completion
from rlax_post.sampler._requests import DriverStats
from rlax_post.sampler._requests import Fork
from rlax_post.sampler._requests import Request
from rlax_post.sampler._engine import Prefix
from rlax_post.sampler._engine import RlaxEngine
from rlax_post.sampler._engine import SlotSettings
from rlax_post.sampler._tokenizer_api import ByteTokenizerAdapter
from rlax_post.sampler._tokenizer_api import prefill_buckets
from rlax_post.sampler._sampling import draw_rows
from rlax_post.sampler._sampling import sample_rows
from rlax_post.sampler._sampling import sample_token
from rlax_post.sampler._sampling import sampling_logprobs
from rlax_post.sampler._sampling import MAX_TEMPERATURE
from rlax_post.sampler._sampling import MIN_TEMPERATURE
from rlax_post.sampler._sampling import MAX_TOP_K
from rlax_post.sampler._sampling import MIN_TOP_P
from rlax_post.sampler._sampling import SamplingLaw
from rlax_post.sampler._sampling import SamplingParams
from rlax_post.sampler._scoring import ScoreService
from rlax_post.sampler._serve import check_request
from rlax_post.sampler._serve import frames_bos
from rlax_post.sampler._serve import serve
from rlax_post.sampler._serve import ServeOptions
from rlax_post.sampler._serve import Server
from rlax_post.sampler._serve import serving_engine
from rlax_post.sampler._serve import ServingEngine

__all__ = [
    'check_request',
    'frames_bos',
    'ServeOptions',
    'Server',
    'ServingEngine',
    'serve',
    'serving_engine',
    "Block",
    "ByteTokenizerAdapter",
    "Completion",
    "Driver",
    "DriverStats",
    "Fork",
    "END_REASONS",
    "Episode",
    "EpisodeRunner",
    "Request",
    "DecodeState",
    "prefill_buckets",
    "Prefix",
    "RlaxEngine",
    "CPU_KV_BLOCK",
    "run_episodes",
    "draw_rows",
    "sample_rows",
    "sample_token",
    "sampling_logprobs",
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "MAX_TOP_K",
    "MIN_TOP_P",
    "SamplingLaw",
    "SamplingParams",
    "ScoreService",
    "SlotSettings",
]
