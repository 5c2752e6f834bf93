"""The sampling law: one token per row from temperature-scaled logits truncated to top-k, then top-p.

`sample_token` applies one law to every row with one key; `sample_rows` gives each row its own law and key
(the engine's decode step, where each slot holds a request with its own `SamplingParams`); `sampling_logprobs`
gives that law's log-probabilities. All truncate through `truncate_rows`, so one law gives the same kept set
every way, and both samplers draw by `draw_rows`: the inverse of each row's cumulative distribution at one
uniform number per row. A Gumbel-max draw (`jax.random.categorical`) needs V random numbers per row; on the
CPU they took 13% of a tiny model's decode step at 64 slots (docs/benchmarks.md), where one number per row
costs nothing. `SamplingLaw` is the law a user gives `serve`, `generate` and `evaluate`, with its seed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


# The model masks padded-vocabulary logits to a finite -1e9 (an -inf would turn a fully masked softmax into NaN);
# divided by a temperature near 1e9 that mask would stop masking. No useful law needs T above this.
MAX_TEMPERATURE = 100.0
# jax's keys are 32-bit: a seed or stream index past this bound would draw a narrower one's samples.
SEED_BOUND = 2**32


def is_int(x, lo, hi) -> bool:
  """Whether `x` is an int (Python's or numpy's; not a bool) in [lo, hi)."""
  return not isinstance(x, bool) and isinstance(x, (int, np.integer)) and lo <= x < hi


# Below this (and above 0, greedy) logits / T leave float32's precision: jitted, log softmax(logits / T) of the
# argmax read +inf or -inf (T = 1e-7 with logits of 300, 1e-11 with logits of 0.3, on the CPU), not ~0: a sampled
# token's logprob and the learner's were then infinite. vLLM samples greedily below the same 1e-5.
MIN_TEMPERATURE = 1e-5
# Below float32's smallest normal number a slot's top_p reads as 0 on the device (denormals flush to zero on the
# CPU): truncation then kept no token and the draw fell back to token 0.
MIN_TOP_P = float(np.finfo(np.float32).tiny)
# A slot's top_k is an int32 on the device (a larger one overflowed building its settings).
MAX_TOP_K = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """One request's sampling law: softmax(logits / temperature) truncated to top-k, then top-p.

  temperature: 0 (greedy: argmax) or in [MIN_TEMPERATURE, MAX_TEMPERATURE]. top_p: in [MIN_TOP_P, 1]; 1 keeps
  every token. top_k: >= 0; 0 keeps every token. Logprobs of a request refer to log softmax(logits / T) with its own T
  (T = 1 when greedy), before truncation.
  """
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0

  def __post_init__(self):
    _check_law(self.temperature, self.top_p, self.top_k)


def _number(x) -> bool:
  return not isinstance(x, bool) and isinstance(x, (int, float, np.integer, np.floating)) and np.isfinite(x)


def _check_law(temperature, top_p, top_k, prefix: str = "") -> None:
  """ValueError naming the first value `SamplingParams` refuses, as `prefix` + its name ("--": the CLI's flag,
  `SamplingLaw.check`; until 2026-12-06 `--temperature -1` was refused as "temperature must be ...")."""
  if not _number(temperature) or not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
    raise ValueError(f"{prefix}temperature must be 0 (greedy) or a number in [{MIN_TEMPERATURE:g}, "
                     f"{MAX_TEMPERATURE:g}]; got {temperature!r}.")
  if not _number(top_p) or not 0.0 < top_p <= 1.0:
    raise ValueError(f"{prefix}top_p must be a number in (0, 1]; got {top_p!r}.")
  if top_p < MIN_TOP_P:  # (until 2026-12-06 taken: the law kept no token, every draw was token 0)
    raise ValueError(f"{prefix}top_p must be at least {MIN_TOP_P:.4g} (float32's smallest normal number: the device "
                     f"reads a smaller one as 0, which keeps no token); got {top_p!r}. Any top_p below the top "
                     "token's probability keeps that token alone.")
  if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
    raise ValueError(f"{prefix}top_k must be an int >= 0 (0 keeps every token); got {top_k!r}.")
  if top_k > MAX_TOP_K:  # (every top_k at or past the vocabulary keeps every token, as 0 does)
    raise ValueError(f"{prefix}top_k must be at most {MAX_TOP_K} (2**31 - 1: the engine holds it as an int32; any "
                     f"top_k >= the vocabulary size keeps every token); got {top_k!r}.")


@dataclasses.dataclass(frozen=True)
class SamplingLaw:
  """The sampling law a user gives `serve`, `generate` and `evaluate` (--temperature, --top_p, --top_k,
  --seed): an engine's default law (`SamplingParams`, here greedy by default) and the `seed` of its streams;
  the options of those commands hold one (`ServeOptions.law`, ...), and an engine takes its fields as its
  keywords of the same names (`settings`). Held as given: `check()` refuses a bad value in one line."""
  temperature: float = 0.0
  top_p: float = 1.0
  top_k: int = 0
  seed: int = 0

  def check(self) -> None:
    """ValueError naming the first bad value as its flag (--temperature, ...): a law `SamplingParams` refuses
    (`_check_law`), or a seed outside [0, 2**32) (jax's keys are 32-bit: 2**32 would sample as 0, and 2**63 fail
    at the first request)."""
    _check_law(self.temperature, self.top_p, self.top_k, prefix="--")
    seed = self.seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
      raise ValueError(f"--seed must be an int in [0, 2**32) (the sampling seed); got {seed!r}.")

  def changed(self) -> tuple[str, ...]:
    """The names of the fields that differ from the default law's (greedy, nothing cut, seed 0), in order."""
    default = SamplingLaw()
    return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(default, f.name))

  def settings(self) -> dict:
    """The law as {"temperature", "top_p", "top_k", "seed"}: `RlaxEngine`'s keywords of those names, and the
    fields of `evaluate`'s result."""
    return dataclasses.asdict(self)

  def file_tag(self) -> str:
    """The law in a file name: temperatureT[_top_pP][_top_kK]_seedS (top_p and top_k where not the default's)."""
    changed = self.changed()
    return "_".join([f"temperature{self.temperature:g}", *[f"top_p{self.top_p:g}"] * ("top_p" in changed),
                     *[f"top_k{self.top_k}"] * ("top_k" in changed), f"seed{self.seed}"])


def truncate_rows(scaled_bv: jax.Array, top_p_b: jax.Array, top_k_b: jax.Array) -> jax.Array:
  """Sets to -inf, row by row, the tokens outside the top-k (k = top_k_b > 0), then outside the smallest set
  of the remaining tokens whose mass reaches top_p_b (< 1; the token that crosses it is kept)."""
  v = scaled_bv.shape[-1]
  sorted_bv = jnp.sort(scaled_bv, axis=-1)[:, ::-1]
  kth_b1 = jnp.take_along_axis(sorted_bv, jnp.clip(top_k_b - 1, 0, v - 1)[:, None], axis=-1)
  kth_b1 = jnp.where(((top_k_b > 0) & (top_k_b < v))[:, None], kth_b1, -jnp.inf)
  scaled_bv = jnp.where(scaled_bv < kth_b1, -jnp.inf, scaled_bv)
  sorted_bv = jnp.where(sorted_bv < kth_b1, -jnp.inf, sorted_bv)
  probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
  # A token is dropped when the mass strictly before it (in sorted order) already reaches top_p.
  keep_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv < top_p_b[:, None]
  threshold_b1 = jnp.min(jnp.where(keep_bv, sorted_bv, jnp.inf), axis=-1, keepdims=True)
  threshold_b1 = jnp.where((top_p_b < 1.0)[:, None], threshold_b1, -jnp.inf)
  return jnp.where(scaled_bv < threshold_b1, -jnp.inf, scaled_bv)


def sampling_logprobs(logits_bv: jax.Array, *, temperature: float, top_p: float = 1.0, top_k: int = 0
                      ) -> jax.Array:
  """log p [B, V] of every token under the law `sample_token` (and a slot of `sample_rows`) draws from with
  these settings: log softmax(truncate_rows(logits / temperature)), the law renormalised over the same kept
  set (ties at the top-k and top-p boundaries kept), -inf outside it; temperature 0: 0 at the argmax (the
  first, as `jnp.argmax`), -inf elsewhere. The draw (`draw_rows`) takes token j with probability its mass
  over the row's kept mass, which is this law (to float rounding). Unlike the logprobs the engine records
  (before truncation), these are the probabilities of what it samples."""
  if logits_bv.ndim != 2:
    raise ValueError(f"logits_bv must be [B, V]; got shape {logits_bv.shape}.")
  SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)  # (ValueError naming a bad value)
  if temperature == 0.0:
    return jnp.where(jnp.arange(logits_bv.shape[-1]) == jnp.argmax(logits_bv, axis=-1, keepdims=True), 0.0,
                     -jnp.inf)
  return jax.nn.log_softmax(_law(logits_bv, temperature, top_p, top_k), axis=-1)


def _law(logits_bv: jax.Array, temperature: float, top_p: float, top_k: int) -> jax.Array:
  """One law's scaled logits [B, V] for every row, -inf outside its kept set (`truncate_rows`, whose sort runs
  only where something is cut); temperature > 0."""
  scaled_bv = logits_bv.astype(jnp.float32) / temperature
  if (top_k and top_k < scaled_bv.shape[-1]) or top_p < 1.0:
    b = scaled_bv.shape[0]
    scaled_bv = truncate_rows(scaled_bv, jnp.full((b,), top_p, jnp.float32), jnp.full((b,), top_k, jnp.int32))
  return scaled_bv


def sample_token(logits_bv: jax.Array, rng: jax.Array, *, temperature: float, top_p: float = 1.0,
                 top_k: int = 0) -> jax.Array:
  """Samples one token per row from softmax(logits / temperature), truncated to top-k then top-p; one key
  for the whole batch. temperature == 0 means greedy (argmax). ValueError for a law `SamplingParams` refuses."""
  SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
  if temperature == 0.0:
    return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
  return draw_rows(_law(logits_bv, temperature, top_p, top_k), jax.random.uniform(rng, logits_bv.shape[:1]))


def sample_rows(logits_bv: jax.Array, keys_b: jax.Array, temperature_b: jax.Array, top_p_b: jax.Array,
                top_k_b: jax.Array) -> jax.Array:
  """One token per row, row b from its own law (temperature_b[b], top_p_b[b], top_k_b[b]; temperature 0 is
  argmax) with its own key keys_b[b] (typed keys). The sort that truncation needs runs only when some row
  truncates."""
  greedy_b = temperature_b == 0.0
  scaled_bv = logits_bv.astype(jnp.float32) / jnp.where(greedy_b, 1.0, temperature_b)[:, None]
  truncates = jnp.any(((top_k_b > 0) & (top_k_b < scaled_bv.shape[-1])) | (top_p_b < 1.0))
  scaled_bv = jax.lax.cond(truncates, truncate_rows, lambda x, *_: x, scaled_bv, top_p_b, top_k_b)
  drawn_b = draw_rows(scaled_bv, jax.vmap(jax.random.uniform)(keys_b))
  return jnp.where(greedy_b, jnp.argmax(logits_bv, axis=-1), drawn_b).astype(jnp.int32)


def draw_rows(scaled_bv: jax.Array, u_b: jax.Array) -> jax.Array:
  """Token of each row of softmax(scaled_bv) (-inf: never drawn) at the uniform number u_b[b] in [0, 1): the
  first token whose cumulative mass exceeds u·(total mass), i.e. token j with probability p_j.

  Only tokens of positive mass are taken (a float cumulative sum may tie a zero-mass token with its
  predecessor); if rounding puts u·total at or past the last cumulative value, the last such token is. A row
  with no positive mass (all -inf, a NaN, or +inf from a tiny temperature) takes its argmax. In float32 the
  draw resolves about 2^-24 of a row's mass, coarser for late ids, where the running sum is large (a
  Gumbel-max draw has a like floor).
  """
  v = scaled_bv.shape[-1]
  scaled_bv = scaled_bv.astype(jnp.float32)
  mass_bv = jnp.exp(scaled_bv - jnp.max(scaled_bv, axis=-1, keepdims=True))
  cumulative_bv = jnp.cumsum(mass_bv, axis=-1)
  positive_bv = mass_bv > 0
  hit_bv = (cumulative_bv > u_b[:, None] * cumulative_bv[:, -1:]) & positive_bv
  last_b = v - 1 - jnp.argmax(positive_bv[:, ::-1], axis=-1)
  last_b = jnp.where(jnp.any(positive_bv, axis=-1), last_b, jnp.argmax(scaled_bv, axis=-1))
  return jnp.where(jnp.any(hit_bv, axis=-1), jnp.argmax(hit_bv, axis=-1), last_b).astype(jnp.int32)
