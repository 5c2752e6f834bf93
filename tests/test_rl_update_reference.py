"""The learner runs a scoring pass only for what reads it: the reference policy for the KL penalty (kl_coef > 0)
or the `kl` metric (`loss.track_kl`), the old policy when a batch takes more than one update (epochs ×
minibatches > 1). With one update the old policy is the current one, read off the update's own forward pass:
the update equals the one fed a separately scored `old_logprobs`."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import advantages
from rlax_post import models
from rlax_post import sharding
from rlax_post.runtime import _batch
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _learn

import _tiny_runs  # pylint: disable=g-bad-import-order


class _CountingScore:
  """Wraps `RLUpdate.score` and counts its calls (the real jitted scorer underneath)."""

  def __init__(self, score):
    self.score, self.calls = score, 0

  def __call__(self, *args):
    self.calls += 1
    return self.score(*args)


def _groups(update, parts):
  p, n = update.cfg.rl.prompts_per_step, update.cfg.rl.samples_per_prompt
  return _tiny_runs.synthetic_groups(parts, [(g + i) % 2 for g in range(p) for i in range(n)])


_setup = _tiny_runs.rl_update


@pytest.mark.parametrize("settings, scores", [
    (dict(loss__kl_coef=0.0, loss__track_kl=False), 0),
    (dict(loss__kl_coef=0.0, loss__track_kl=True), 1),
    (dict(loss__kl_coef=0.05, loss__track_kl=False), 1),
    (dict(loss__kl_coef=0.0, loss__track_kl=False, rl__epochs=2), 1),
])
def test_scoring_passes_run_only_for_what_reads_them(settings, scores):
  update, parts, params, state = _setup(**settings)
  update.score = _CountingScore(update.score)
  _, metrics = update(state, params, update.batch(_groups(update, parts)), 0)
  assert update.score.calls == scores
  reads_ref = settings["loss__kl_coef"] > 0 or settings["loss__track_kl"]
  assert ("kl" in metrics) == reads_ref
  if reads_ref:
    assert abs(metrics["kl"]) < 1e-9  # Step 0: the policy is the reference (rounding apart).
  assert ("logprob_mismatch_max" in metrics) == (settings.get("rl__epochs", 1) > 1)
  # The sampler said -3 for every token; the learner's logprobs differ: the gap is their weighted mean.
  assert metrics["behaviour_gap"] > 0


def test_one_update_without_old_logprobs_equals_one_with_them_scored():
  update, parts, _, state = _setup(loss__kl_coef=0.0, loss__track_kl=False)
  batch = update.batch(_groups(update, parts))
  adv_bt, _ = update.credit(batch.rewards, batch.group_ids, batch.tokens, batch.prompt_lens, batch.lengths,
                            batch.loss_mask)
  full = {"tokens": batch.tokens, "loss_mask": batch.loss_mask, "advantages": adv_bt,
          "behaviour_logprobs": batch.behaviour_logprobs}
  scored = dict(full, old_logprobs=np.asarray(update.score(state.params, batch.tokens, batch.loss_mask)))
  rng = jax.random.key(3)
  # The step donates its state: each call gets its own copy.
  outs = [update.learner.step(jax.tree.map(jnp.copy, state), _batch.to_device_batch(b, update.batch_sh), rng)
          for b in (full, scored)]
  (new_a, m_a), (new_b, m_b) = outs
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), new_a.params, new_b.params)
  for key in ("loss", "pg_loss", "behaviour_gap", "entropy"):
    np.testing.assert_allclose(float(m_a[key]), float(m_b[key]), rtol=1e-5, atol=1e-7)
  assert float(m_a["clip_frac"]) == 0.0  # Ratios exactly 1.


def test_a_rule_set_that_maps_batch_elsewhere_places_the_batch_where_the_update_takes_it():
  """`mesh.rules` with 'batch' on the data axis alone (a valid rule set): the learner put its batch on a fixed
  ('data', 'fsdp') sharding, and the jitted update refused it (a helper review). The step now runs, with the
  loss of the default rules'."""
  rules = tuple((name, "data" if name == "batch" else axes) for name, axes in sharding.DEFAULT_RULES)
  losses = []
  for settings in (dict(), dict(mesh__rules=rules)):
    update, parts, params, state = _setup(mesh__data=2, mesh__fsdp=4, mesh__tensor=1, **settings)
    assert update.batch_sh.spec == sharding.batch_sharding(parts.mesh, parts.rules, 1).spec
    _, metrics = update(state, update.reference(state, params), update.batch(_groups(update, parts)), 0)
    losses.append(float(metrics["loss"]))
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5, atol=1e-7)


def test_mask_truncated_trains_no_token_of_an_unfinished_row_and_still_credits_it():
  """`loss.mask_truncated` (DAPO's overlong filtering, TRL's `mask_truncated_completions`): every third row did not
  finish; the update equals the one of a batch that finished with those rows' tokens taken out of the loss mask by
  hand (the group statistics still count their rewards), and differs from training them."""
  update, parts, params, state = _setup(loss__mask_truncated=True, loss__kl_coef=0.0, loss__track_kl=False)
  batch = update.batch(_groups(update, parts))
  unfinished = np.arange(len(batch.finished)) % 3 == 0
  cut = batch._replace(finished=~unfinished)
  by_hand = batch._replace(finished=np.ones_like(batch.finished),
                           loss_mask=batch.loss_mask * (~unfinished)[:, None].astype(np.float32))
  (new_cut, m_cut), (new_hand, m_hand), (_, m_all) = [
      update(jax.tree.map(jnp.copy, state), params, b, 0) for b in (cut, by_hand, batch)]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8), new_cut.params, new_hand.params)
  for key in ("loss", "pg_loss", "entropy", "grad_norm"):
    np.testing.assert_allclose(float(m_cut[key]), float(m_hand[key]), rtol=1e-5, atol=1e-7)
  assert m_cut["num_tokens"] == m_hand["num_tokens"] == float(by_hand.loss_mask.sum()) < float(batch.loss_mask.sum())
  assert m_cut["finished_frac"] == pytest.approx(1 - unfinished.mean())
  # (Adam's first step is lr·sign(g) per weight: the gradient itself shows the rows left out.)
  assert abs(float(m_all["grad_norm"]) - float(m_cut["grad_norm"])) > 1e-4 * float(m_all["grad_norm"])


def test_a_step_logs_its_updates_mean_and_the_running_skip_count_after_its_last():
  """An RL step of several updates (`rl.epochs` x `rl.minibatches`) logs each learner metric's mean over them,
  but `num_skipped`, a running count, as it is after the last: the mean of the counts logged 2.5 after 4
  skipped updates (a review, 2026-12-06)."""
  updates = [{"loss": 1.0, "skipped": 0.0, "num_skipped": 3.0}, {"loss": 3.0, "skipped": 1.0, "num_skipped": 4.0}]
  assert _learn.step_learner_metrics(updates) == {"loss": 2.0, "skipped": 0.5, "num_skipped": 4.0}


@pytest.mark.slow
def test_a_step_of_skipped_updates_logs_the_learners_skip_count():
  """Rewards that make every update's loss NaN (each skipped, the params kept): the step's `num_skipped` is
  the state's, 4 then 8 over two steps of 2 epochs x 2 minibatches, and `skipped` is 1."""
  update, parts, params, state = _setup(rl__epochs=2, rl__minibatches=2)
  p, n = update.cfg.rl.prompts_per_step, update.cfg.rl.samples_per_prompt
  batch = update.batch(_tiny_runs.synthetic_groups(parts, [np.nan if i % 2 else 0.0 for i in range(p * n)]))
  ref = update.reference(state, params)
  for step, count in ((0, 4), (1, 8)):
    state, metrics = update(state, ref, batch, step)
    assert int(state.num_skipped) == count and metrics["num_skipped"] == count and metrics["skipped"] == 1.0


def test_top_entropy_quantile_trains_the_policy_gradient_on_the_high_entropy_tokens_only():
  """`loss.top_entropy_quantile` ρ ("Beyond the 80/20 rule"): the step equals one whose advantages are zeroed by
  hand on the trained tokens below numpy's (1 − ρ) quantile of the old policy's entropies (their normaliser and
  entropy term unchanged), and differs from training every token."""
  update, parts, params, state = _setup(loss__top_entropy_quantile=0.5, loss__kl_coef=0.0, loss__track_kl=False)
  batch = update.batch(_groups(update, parts))
  _, entropy_bt = update.score_policy(state, batch)
  trained = batch.loss_mask == 1
  tau = np.quantile(entropy_bt[trained], 0.5)
  keep = trained & (entropy_bt >= tau)
  adv_bt, fields, _ = update.credit.assign(state, batch)
  rng = jax.random.key(0)  # The forward pass is deterministic: any key.
  outs = []
  for advantages in (adv_bt * keep, adv_bt):
    full = {"tokens": batch.tokens, "loss_mask": batch.loss_mask, "advantages": advantages,
            "behaviour_logprobs": batch.behaviour_logprobs, **fields}
    outs.append(update.learner.step(jax.tree.map(jnp.copy, state), _batch.to_device_batch(full, update.batch_sh),
                                    rng))
  (new_hand, m_hand), (_, m_all) = outs
  new_sel, m_sel = update(jax.tree.map(jnp.copy, state), params, batch, 0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8), new_sel.params, new_hand.params)
  for key in ("loss", "pg_loss", "entropy", "grad_norm"):
    np.testing.assert_allclose(float(m_sel[key]), float(m_hand[key]), rtol=1e-5, atol=1e-7)
  assert m_sel["num_tokens"] == float(trained.sum())  # Every trained token stays in the normaliser.
  assert m_sel["pg_token_frac"] == pytest.approx(keep.sum() / trained.sum()) and 0.4 < m_sel["pg_token_frac"] < 0.6
  assert m_sel["entropy_threshold"] == pytest.approx(tau, rel=1e-6)
  assert abs(float(m_all["grad_norm"]) - float(m_sel["grad_norm"])) > 1e-3 * float(m_all["grad_norm"])


def test_kl_in_the_reward_credits_each_rows_reward_less_beta_times_its_summed_kl():
  """`advantage.reward_kl_coef` β (verl's use_kl_in_reward): the step equals one credited by hand with each row's
  reward less β · Σ_t (log π_old − log π_ref) over its response tokens (k1; a reference other than the policy),
  logs the raw reward and the rows' mean KL, and its advantages differ from the unshaped rewards'."""
  update, parts, params, state = _setup(advantage__reward_kl_coef=0.5, loss__kl_coef=0.0, loss__track_kl=False)
  ref = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(1))[1], parts.param_shardings)
  batch = update.batch(_groups(update, parts))
  old_bt = np.asarray(update.score(update.policy(state), batch.tokens, batch.loss_mask))
  ref_bt = np.asarray(update.score(ref, batch.tokens, batch.loss_mask))
  kl_b = ((old_bt - ref_bt) * batch.loss_mask).sum(axis=1)
  shaped = batch._replace(rewards=(batch.rewards - 0.5 * kl_b).astype(np.float32))
  adv_bt, fields, _ = update.credit.assign(state, shaped)
  plain_bt, _, _ = update.credit.assign(state, batch)
  assert np.abs(adv_bt - plain_bt).max() > 1e-2
  full = {"tokens": batch.tokens, "loss_mask": batch.loss_mask, "advantages": adv_bt,
          "behaviour_logprobs": batch.behaviour_logprobs, **fields}
  new_hand, m_hand = update.learner.step(jax.tree.map(jnp.copy, state), _batch.to_device_batch(full, update.batch_sh),
                                         jax.random.key(0))
  new_kl, m_kl = update(jax.tree.map(jnp.copy, state), ref, batch, 0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), new_kl.params, new_hand.params)
  for key in ("pg_loss", "grad_norm"):
    np.testing.assert_allclose(float(m_kl[key]), float(m_hand[key]), rtol=1e-4, atol=1e-7)
  assert m_kl["reward_kl_mean"] == pytest.approx(kl_b.mean(), rel=1e-5) and abs(kl_b.mean()) > 1e-2
  assert m_kl["reward_kl_penalty"] == pytest.approx(0.5 * kl_b.mean(), rel=1e-5)
  assert m_kl["reward_mean"] == pytest.approx(float(batch.rewards.mean()))


def test_adaptive_kl_in_the_reward_adapts_beta_after_each_step_and_checkpoints_it(tmp_path):
  """`advantage.reward_kl_target` > 0: β starts at reward_kl_coef, penalises the first batch with it, then moves by
  Ziegler et al.'s rule on the batch's mean per-token KL; the next step penalises with the new β, and β travels in
  the state's controls through a checkpoint (as a resume reads it)."""
  update, parts, params, state = _setup(advantage__reward_kl_coef=0.5, advantage__reward_kl_target=0.01,
                                        advantage__reward_kl_horizon=16, loss__kl_coef=0.0, loss__track_kl=False)
  ref = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(1))[1], parts.param_shardings)
  batch = update.batch(_groups(update, parts))
  mask = batch.loss_mask
  kl_bt = (np.asarray(update.score(update.policy(state), batch.tokens, mask))
           - np.asarray(update.score(ref, batch.tokens, mask))) * mask
  token_mean = float((kl_bt.sum(axis=1) / np.maximum(mask.sum(axis=1), 1)).mean())
  assert abs(token_mean / 0.01 - 1) > 0.05  # off target: β moves
  beta1 = 0.5 * (1 + np.clip(token_mean / 0.01 - 1, -0.2, 0.2) * len(mask) / 16)
  new, m0 = update(jax.tree.map(jnp.copy, state), ref, batch, 0)
  assert m0["reward_kl_coef"] == 0.5 and m0["reward_kl_penalty"] == pytest.approx(0.5 * m0["reward_kl_mean"])
  assert m0["reward_kl_token_mean"] == pytest.approx(token_mean, rel=1e-5)
  assert float(new.controls["reward_kl_coef"]) == pytest.approx(beta1, rel=1e-5) and abs(beta1 - 0.5) > 1e-3
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=1)
  ckpt.save(1, new, ref, {"note": "adaptive"})
  ckpt.wait()
  restored, _, _ = ckpt.restore(1, **update.checkpoint_templates)
  ckpt.close()
  assert float(restored.controls["reward_kl_coef"]) == float(new.controls["reward_kl_coef"])
  _, m1 = update(restored, ref, batch, 1)
  assert m1["reward_kl_coef"] == pytest.approx(beta1, rel=1e-5)
  assert m1["reward_kl_penalty"] == pytest.approx(beta1 * m1["reward_kl_mean"], rel=1e-5)


def test_fixed_kl_in_the_reward_keeps_no_controls():
  """Without a target β is the setting itself: no run state is added to the policy's."""
  update, _, _, state = _setup(advantage__reward_kl_coef=0.5)
  assert state.controls is None and update.checkpoint_templates["state_like"].controls is None


def test_kl_in_the_reward_of_gae_is_a_reward_at_each_token():
  """With gae (InstructGPT's PPO) the penalty is a reward −β·kl_t at each trained token besides the outcome at the
  row's last: the step's returns and advantages are GAE's of those rewards, computed here by hand."""
  update, parts, params, state = _setup(advantage__estimator="gae", advantage__reward_kl_coef=0.5,
                                        loss__kl_coef=0.0, loss__track_kl=False)
  ref = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(1))[1], parts.param_shardings)
  batch = update.batch(_groups(update, parts))
  mask = batch.loss_mask
  kl_bt = (np.asarray(update.score(update.policy(state), batch.tokens, mask))
           - np.asarray(update.score(ref, batch.tokens, mask))) * mask
  rows = np.arange(len(mask))
  r_bt = -0.5 * kl_bt
  r_bt[rows, batch.prompt_lens + batch.lengths - 2] += batch.rewards  # each row's last trained target
  values_bt = update.critic.values(state.critic.params, batch.tokens, mask)
  cfg = update.cfg.advantage
  adv_bt, returns_bt = (np.asarray(x) for x in advantages.gae_over_mask(r_bt, values_bt, mask, gamma=cfg.gamma,
                                                                       lambda_=cfg.lambda_))
  got_bt, fields, _ = update.credit.assign(state, batch._replace(token_rewards=(-0.5 * kl_bt).astype(np.float32)))
  assert cfg.normalize is None
  np.testing.assert_allclose(got_bt, adv_bt * mask, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(fields["returns"], returns_bt, rtol=1e-4, atol=1e-5)
  _, metrics = update(jax.tree.map(jnp.copy, state), ref, batch, 0)
  assert metrics["return_mean"] == pytest.approx(float(returns_bt[mask > 0].mean()), rel=1e-4)
  assert metrics["reward_kl_mean"] == pytest.approx(float(kl_bt.sum(axis=1).mean()), rel=1e-5)


def test_the_advantage_scale_setting_reaches_the_credit():
  """`advantage.scale = "batch"`: the run's credit divides each row's centred reward by the std of all rows."""
  from rlax_post import config  # pylint: disable=g-import-not-at-top
  from rlax_post.runtime import _credit  # pylint: disable=g-import-not-at-top
  cfg = config.load({"advantage": {"scale": "batch"}})
  credit = _credit.Credit(cfg.advantage, num_groups=2, batch=4, max_new_tokens=2, tree=cfg.tree)
  rewards, groups = np.array([1.0, 0.0, 3.0, 1.0], np.float32), np.array([0, 0, 1, 1], np.int32)
  np.testing.assert_allclose(credit._fn(rewards, groups), np.array([0.5, -0.5, 1.0, -1.0]) / (np.std(rewards, ddof=1)
                                                                                        + 1e-6), rtol=1e-5)
