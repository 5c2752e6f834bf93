"""The training loop's sampler: the RL driver over `RlaxEngine`, returning rollouts as padded arrays."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from rlax_post import models
from rlax_post import sampler


class Rollouts(NamedTuple):
  """n samples per prompt, rows prompt-major (row = prompt · n + sample), right-padded with PAD."""
  tokens: np.ndarray  # [B, Tp + N] int32: prompt then generated tokens, contiguous.
  response: np.ndarray  # [B, N] int32: generated tokens (EOS included), PAD after the end.
  logprobs: np.ndarray  # [B, N] float32: the sampler's log π_T of each generated token, 0 after the end.
  versions: np.ndarray  # [B, N] int32: parameter version of each generated token, -1 after the end.
  lengths: np.ndarray  # [B] int32: generated tokens per row.
  finished: np.ndarray  # [B] bool: the row ended on EOS (else it hit max_new_tokens).


def _pow2_at_least(n: int, floor: int = 16) -> int:
  b = floor
  while b < n:
    b *= 2
  return b


class Sampler:
  """An engine sized for the run (slots = rollouts per step) and a fresh driver per batch.

  A new driver per batch, seeded from the caller's seed, makes the samples a pure function of
  (params, prompts, seed): a resumed run draws exactly what an uninterrupted one would.
  """

  def __init__(self, model_cfg: models.ModelConfig, graphdef, tokenizer: models.ByteTokenizer, mesh, *,
               slots: int, max_prompt_len: int, max_new_tokens: int, temperature: float, top_p: float = 1.0,
               top_k: int = 0):
    decode_len = min(model_cfg.max_seq_len, max(_pow2_at_least(max_prompt_len), max_prompt_len + max_new_tokens))
    prefill_cap = min(_pow2_at_least(max_prompt_len), decode_len)
    if decode_len < max_prompt_len + max_new_tokens:
      raise ValueError(f"model max_seq_len {model_cfg.max_seq_len} cannot hold prompts of {max_prompt_len} "
                       f"tokens plus {max_new_tokens} new tokens.")
    self.tokenizer, self.max_new_tokens, self.max_prompt_len = tokenizer, max_new_tokens, max_prompt_len
    self.engine = sampler.RlaxEngine(model_cfg, graphdef, tokenizer=tokenizer, mesh=mesh,
                                     max_concurrent_decodes=slots, max_prefill_length=prefill_cap,
                                     max_decode_length=decode_len, temperature=temperature, top_p=top_p,
                                     top_k=top_k)

  def __call__(self, params, prompts: Sequence[Sequence[int]], *, n: int, seed: int,
               version: int = 0) -> Rollouts:
    driver = sampler.Driver(self.engine, params, version=version, seed=seed)
    requests = [sampler.Request(prompt=tuple(int(t) for t in p), n=n, max_tokens=self.max_new_tokens,
                                request_id=i) for i, p in enumerate(prompts)]
    completions = driver.sample(requests)
    b, n_max = len(completions), self.max_new_tokens
    tp = self.max_prompt_len  # A fixed width: the learner's jitted functions compile once.
    if max(len(p) for p in prompts) > tp:
      raise ValueError(f"A prompt of {max(len(p) for p in prompts)} tokens exceeds max_prompt_len {tp}.")
    pad = self.tokenizer.pad_id
    tokens = np.full((b, tp + n_max), pad, np.int32)
    response = np.full((b, n_max), pad, np.int32)
    logprobs = np.zeros((b, n_max), np.float32)
    versions = np.full((b, n_max), -1, np.int32)
    lengths = np.zeros((b,), np.int32)
    finished = np.zeros((b,), bool)
    for row, c in enumerate(completions):
      k = len(c.tokens)
      tokens[row, :len(c.prompt)] = c.prompt
      tokens[row, len(c.prompt):len(c.prompt) + k] = c.tokens
      response[row, :k] = c.tokens
      logprobs[row, :k] = c.logprobs
      versions[row, :k] = c.versions
      lengths[row] = k
      finished[row] = c.finish_reason == "stop"
    return Rollouts(tokens, response, logprobs, versions, lengths, finished)
