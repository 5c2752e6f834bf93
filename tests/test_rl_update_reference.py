"""The learner scores the reference policy only when something reads it: the KL penalty (kl_coef > 0) or the
`kl` metric asked for with `loss.track_kl`; then at step 0 (policy = reference) the reported KL is 0 to rounding."""

import sys

import jax
import numpy as np
import pytest

from rlax_post import config
from rlax_post import models
from rlax_post import runtime

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


class _CountingScore:
  """Wraps `RLUpdate.score` and counts its calls (a real jitted scorer underneath)."""

  def __init__(self, score):
    self.score, self.calls = score, 0

  def __call__(self, *args):
    self.calls += 1
    return self.score(*args)


def _groups(update, parts):
  rng = np.random.default_rng(0)
  p, n, r = update.cfg.rl.prompts_per_step, update.cfg.rl.samples_per_prompt, parts.lengths.response
  groups = []
  for g in range(p):
    prompt = [parts.tokenizer.bos_id] + [int(x) for x in rng.integers(97, 123, 5)]
    groups.append([{"prompt": np.asarray(prompt, np.int32), "tokens": rng.integers(97, 123, r).astype(np.int32),
                    "mask": np.ones(r, np.int32), "logprobs": np.full(r, -3.0, np.float32),
                    "versions": np.zeros(r, np.int32), "reward": np.float32((g + i) % 2),
                    "finished": True} for i in range(n)])
  return groups


@pytest.mark.parametrize("kl_coef, track_kl, scores", [(0.0, False, 1), (0.0, True, 2), (0.05, False, 2)])
def test_the_reference_is_scored_only_when_read(kl_coef, track_kl, scores):
  c = demo.get_config("tiny")
  c.loss.kl_coef, c.loss.track_kl = kl_coef, track_kl
  cfg = config.load(c)
  parts = runtime.build_parts(cfg)
  update = runtime.RLUpdate(parts)
  update.score = _CountingScore(update.score)
  params = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(0))[1], parts.param_shardings)
  state = update.init(params, cfg.seed)
  _, metrics = update(state, params, update.batch(_groups(update, parts)), 0)
  assert update.score.calls == scores  # The old policy always; the reference when read.
  if scores == 1:
    assert "kl" not in metrics
  else:
    assert abs(metrics["kl"]) < 1e-9  # Step 0: the policy is the reference (rounding apart).
