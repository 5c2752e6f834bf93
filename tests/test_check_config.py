"""`runtime.check_config` (`rlax-post check-config`) refuses what `train` refuses before it loads a model, in the
same words, through the same functions: a critic model's `critic.hf_path`, `model.overrides` that a model setting
of its own makes, every task's lengths in the model's context, the model's and the critic's configs."""

import os
import re
import sys

import jax
import pytest

from rlax_post import config
from rlax_post import models
from rlax_post import runtime
from rlax_post import sharding
from rlax_post import sweep
from rlax_post.runtime import _metrics
from rlax_post.runtime import _parts

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cfg(name: str = "demo.py:tiny", **overrides) -> config.Config:
  """The validated config of `configs/<name>` with `overrides` ({"a.b": value})."""
  file, _, variant = name.partition(":")
  module = sweep.load_module(os.path.join(_ROOT, "configs", file))
  return config.load(sweep.apply(module.get_config(variant or None), overrides))


def _refusals(cfg: config.Config) -> tuple[str, str]:
  """The errors `rlax-post check-config` (`runtime.check_config`) and `train` (as it builds the run's parts)
  give for `cfg`."""
  with pytest.raises(ValueError) as checked:
    runtime.check_config(cfg)
  with pytest.raises(ValueError) as built:  # where `train` refuses it
    runtime.build_parts(cfg)
  return str(checked.value), str(built.value)


def _gae_critic(**critic) -> config.Config:
  """demo.py:tiny with a separate critic (`advantage.estimator = "gae"`) of `critic` settings."""
  return _cfg(**{"advantage.estimator": "gae", **{f"critic.{k}": v for k, v in critic.items()}})


def _policy_config(cfg: config.Config) -> models.ModelConfig:
  return _parts.model_config(cfg, models.ByteTokenizer())


@pytest.mark.parametrize("kind", ["missing", "run", "no config"])
def test_check_config_refuses_a_bad_critic_hf_path_as_the_critic_does(tmp_path, kind):
  """check-config checked `model.hf_path` but not `critic.hf_path`: a missing critic checkpoint passed it and
  stopped `train` once the policy was built, in a bare FileNotFoundError of config.json. Both now name it, by the
  one check (`check_hf_path`) the policy's checkpoint has."""
  path = {"missing": str(tmp_path / "nope"), "run": str(tmp_path / "run"), "no config": str(tmp_path / "ckpt")}[kind]
  os.makedirs(tmp_path / "run" / "checkpoints")
  (tmp_path / "run" / "config.json").write_text("{}")
  os.makedirs(tmp_path / "ckpt")
  message = {
      "missing": f"`critic.hf_path` = {path!r} does not exist; set it to a local Hugging Face checkpoint directory "
                 "(config.json, *.safetensors).",
      "run": f"`critic.hf_path` = {path!r} is the workdir of a training run (config.json and checkpoints/), not a "
             f"Hugging Face checkpoint; export its policy first: `rlax-post export --workdir {path} --out DIR`, "
             "then set critic.hf_path to DIR (or start the critic from the policy's weights: `critic.init = "
             "'policy'`).",
      "no config": f"`critic.hf_path` = {path!r} has no config.json; a checkpoint directory needs config.json and "
                   "*.safetensors (model.save_pretrained).",
  }[kind]
  cfg = _gae_critic(init="hf", hf_path=path)
  with pytest.raises(FileNotFoundError) as checked:
    runtime.check_config(cfg)
  assert str(checked.value) == message
  with pytest.raises(FileNotFoundError) as built:  # what `train`'s critic (runtime.Critic) calls
    _parts.critic_model_config(cfg, _policy_config(cfg))
  assert str(built.value) == message


def test_check_config_refuses_critic_init_hf_without_a_path():
  cfg = _gae_critic(init="hf")
  with pytest.raises(ValueError, match=re.escape("critic.init = 'hf' needs critic.hf_path, a local Hugging Face "
                                                 "checkpoint directory (config.json, *.safetensors); set it, or "
                                                 "start the critic from the policy (critic.init = 'policy')")):
    runtime.check_config(cfg)


def test_check_config_passes_a_critic_checkpoint_without_a_tokenizer(tmp_path):
  """A critic reads the policy's tokens: its checkpoint needs config.json (and weights), no tokenizer.json."""
  cfg = _gae_critic(init="hf", hf_path=str(tmp_path))
  policy = _policy_config(cfg)
  hf_cfg = models.preset("micro", vocab_size=policy.vocab_size, num_layers=2)
  models.export_hf(str(tmp_path), hf_cfg, models.init_params(hf_cfg, jax.random.key(0))[1],
                   architecture="LlamaForCausalLM")
  assert not os.path.exists(tmp_path / "tokenizer.json")
  runtime.check_config(cfg)
  assert _parts.critic_model_config(cfg, policy).num_layers == 2


def test_check_config_leaves_critic_hf_path_alone_without_a_critic_model(tmp_path):
  """A shared critic (a value head on the policy) builds no critic model, so `critic.hf_path` is not read: the
  config's read check refuses it being set (`config.check_reads`), and check-config does not look for it."""
  cfg = _cfg(**{"advantage.estimator": "gae", "critic.mode": "shared"})
  assert cfg.critic.init == "policy" and cfg.critic.hf_path is None
  runtime.check_config(cfg)


def test_a_model_overrides_max_seq_len_unlike_model_max_seq_len_is_refused():
  """`model.overrides.max_seq_len` = 128 beside `model.max_seq_len` = 32 built a model of 128 positions while the
  rest of the run read 32 (`run_memory` counted 32-token rows, 6x too little; the tools task's slack and the warm
  start's rows were sized by it): the two now must agree, and the error says which line to keep."""
  with pytest.raises(ValueError) as refused:
    _cfg(**{"model.overrides": {"max_seq_len": 128}})
  assert str(refused.value) == (
      "In `config.model`: `model.overrides.max_seq_len` = 128 and `model.max_seq_len` = 32 both set the model's "
      "context and differ (the override built the model, the rest of the run reads model.max_seq_len); set it once: "
      "model.max_seq_len = 128, and drop max_seq_len from model.overrides.")
  same = _cfg(**{"model.overrides": {"max_seq_len": 32}})  # (repeating it changes nothing)
  assert config.max_seq_len(same) == same.model.max_seq_len == _policy_config(same).max_seq_len == 32
  longer = _cfg(**{"model.max_seq_len": 128})
  assert config.max_seq_len(longer) == _policy_config(longer).max_seq_len == 128


@pytest.mark.parametrize("value", [True, False])
def test_a_model_overrides_value_head_is_refused(value):
  """The policy's value head follows the critic's settings (`config.policy_value_head`): an override of it was
  a head nothing trains (True) or silently replaced (False beside a shared critic)."""
  with pytest.raises(ValueError) as refused:
    _cfg(**{"model.overrides": {"value_head": value}})
  assert str(refused.value) == (
      f"In `config.model`: `model.overrides.value_head` = {value}: the policy's value head follows the critic's "
      "settings (one exactly when advantage.estimator = 'gae' and critic.mode = 'shared'; a head without them is one "
      "nothing trains, and False beside them was replaced); drop value_head from model.overrides and set those.")


def test_model_vocab_multiple_beside_a_model_overrides_vocab_size_is_refused_as_unread():
  """`model.overrides.vocab_size` is the vocabulary as given, so `model.vocab_multiple` (which pads the
  tokenizer's) was silently not read: a value other than its default is refused like any unread setting."""
  with pytest.raises(ValueError) as refused:
    _cfg(**{"model.overrides": {"vocab_size": 320}, "model.vocab_multiple": 64})
  assert str(refused.value).endswith(
      "`model.vocab_multiple` = 64 (default 8): read only with no vocab_size in model.overrides; this run has "
      "model.overrides.vocab_size = 320")
  assert _policy_config(_cfg(**{"model.overrides": {"vocab_size": 320}})).vocab_size == 320
  assert _policy_config(_cfg(**{"model.vocab_multiple": 64})).vocab_size == 320  # 259 byte ids, padded to 64s


def test_keep_best_needs_every_checkpointed_step_evaluated():
  """`checkpoint.keep_best` ranks checkpoints by their own step's held-out evaluation: a checkpoint cadence that is
  not a positive multiple of eval.every (TRL asks the same of save_steps and eval_steps) is refused."""
  for settings in ({"eval.every": 0}, {"checkpoint.every": 3}, {"checkpoint.every": 0}):
    values = {"checkpoint.every": 2, "eval.every": 2, **settings}  # (demo.py:tiny's, and the change)
    with pytest.raises(ValueError) as refused:
      _cfg(**{"checkpoint.keep_best": 1, **settings})
    assert str(refused.value).endswith(
        "checkpoint.keep_best = 1 keeps the checkpoints of the best held-out eval reward, so every checkpointed "
        f"step must be evaluated: checkpoint.every = {values['checkpoint.every']} must be a positive multiple of "
        f"eval.every = {values['eval.every']}."), settings
  kept = _cfg(**{"checkpoint.keep_best": 2, "checkpoint.every": 4})
  assert (kept.checkpoint.keep_best, kept.checkpoint.max_to_keep) == (2, 2)


@pytest.mark.parametrize("name, settings, message", [
    ("demo.py:tiny", {"model.max_seq_len": 12}, "`model.max_seq_len` = 12 cannot hold the 12-token context of "
     "task 'reverse' plus rl.max_new_tokens = 8 (20 tokens); set model.max_seq_len >= 20."),
    ("demo.py:tiny", {"model.max_seq_len": 24, "rl.max_new_tokens": 16}, "`model.max_seq_len` = 24 cannot hold "
     "the 12-token context of task 'reverse' plus rl.max_new_tokens = 16 (28 tokens); set model.max_seq_len >= 28, "
     "or rl.max_new_tokens <= 12."),
    ("multiagent.py:tiny", {"model.max_seq_len": 16}, "`model.max_seq_len` = 16 cannot hold the 20-token "
     "context of task 'relay' plus rl.max_new_tokens = 8 (28 tokens); set model.max_seq_len >= 28."),
    ("tools_tiny.py", {"model.max_seq_len": 200}, "`model.max_seq_len` = 200 cannot hold the 160-token context "
     "of task 'tools' plus rl.max_new_tokens = 288 (448 tokens); set model.max_seq_len >= 448."),
    ("tools_tiny.py", {"model.max_seq_len": 300}, "`model.max_seq_len` = 300 cannot hold the 160-token context "
     "of task 'tools' plus rl.max_new_tokens = 288 (448 tokens); set model.max_seq_len >= 448, or "
     "rl.max_new_tokens <= 140."),
    ("sales.py:tiny", {"model.max_seq_len": 300}, "`model.max_seq_len` = 300 cannot hold the 113-token context "
     "of task 'sales' plus rl.max_new_tokens = 224 (337 tokens); set model.max_seq_len >= 337, or "
     "rl.max_new_tokens <= 187."),
    ("sales.py:tiny", {"model.max_seq_len": 250}, "`model.max_seq_len` = 250 cannot hold the 113-token context "
     "of task 'sales' plus rl.max_new_tokens = 224 (337 tokens); set model.max_seq_len >= 337."),
    ("dialogue.py:tiny", {"model.max_seq_len": 500}, "`model.max_seq_len` = 500 cannot hold the 342-token "
     "context of task 'dialogue' plus rl.max_new_tokens = 448 (790 tokens); set model.max_seq_len >= 790."),
    ("dialogue.py:tiny", {"rl.max_new_tokens": 500}, "`model.max_seq_len` = 800 cannot hold the 342-token "
     "context of task 'dialogue' plus rl.max_new_tokens = 500 (842 tokens); set model.max_seq_len >= 842, or "
     "rl.max_new_tokens <= 458."),
], ids=["text", "text-shorter-responses", "relay", "tools-whole-messages", "tools", "sales",
        "sales-whole-conversations", "dialogue-whole-conversations", "dialogue"])
def test_check_config_checks_every_tasks_lengths_as_train_does(name, settings, message):
  """check-config checked the prompt + response budget of the dataset task alone; a built-in, role, tool,
  sales or dialogue task whose rows `model.max_seq_len` cannot hold passed it and stopped `train` as it built
  the task. Both now reach the task's own `lengths` (`runtime.run_lengths`), and it names what fits (a sales
  run's `rl.max_new_tokens` may not shrink below a whole conversation, 146 tokens here: with 137 left after the
  context, only the context is named; a dialogue run's below a whole conversation either, 439 tokens; a tool
  run's below one whole message and a token more, 129). (The dataset task's: tests/test_cli.py, with rows for
  `train` to read.)"""
  cfg = _cfg(name, **settings)
  assert _refusals(cfg) == (message, message)


@pytest.mark.parametrize("name", ["demo.py:tiny", "multiagent.py:tiny", "tools_tiny.py", "sales.py:tiny",
                                  "dialogue.py:tiny"])
def test_check_config_passes_a_context_that_holds_the_tasks_rows(name):
  """The shipped tiny configs fit: check-config passes them, and its lengths are those `train` builds with."""
  cfg = _cfg(name)
  runtime.check_config(cfg)
  tokenizer = _parts.make_tokenizer(cfg)
  lengths = _parts.run_lengths(cfg, tokenizer, _parts.model_config(cfg, tokenizer))
  assert lengths == runtime.build_parts(cfg).lengths
  assert lengths.sequence <= cfg.model.max_seq_len


def test_check_config_builds_the_model_and_critic_configs_as_train_does():
  """A preset whose overrides do not make a model, and a critic whose vocabulary is not the policy's, passed
  check-config and were refused once `train` built the model (the critic: once the policy was built)."""
  bad_heads = _cfg(**{"model.overrides": {"num_heads": 3}})
  with pytest.raises(ValueError) as bad:
    runtime.check_config(bad_heads)
  assert str(bad.value) == ("Bad `model` config (`model.preset` = 'micro', `model.overrides` = {'num_heads': 3}): "
                            "ModelConfig.num_kv_heads (2) must divide num_heads (3).")
  critic = _gae_critic(init="preset", overrides={"vocab_size": 999})
  with pytest.raises(ValueError) as refused:
    runtime.check_config(critic)
  assert str(refused.value) == ("The critic's vocabulary (999 ids, critic.init = 'preset') differs from the policy's "
                                "(264); the critic reads the policy's tokens, so it needs the same tokenizer.")


@pytest.mark.parametrize("overrides, message", [
    ({"rope_theta": "x"}, "Bad `model` config (`model.preset` = 'micro', `model.overrides` = {'rope_theta': 'x'}): a "
     "value of the wrong type ('>' not supported between instances of 'str' and 'int')"),
    ({"num_heads": 0}, "Bad `model` config (`model.preset` = 'micro', `model.overrides` = {'num_heads': 0}): "
     "ModelConfig.num_heads must be a positive int; got 0."),
], ids=["type", "value"])
def test_a_bad_model_overrides_value_is_named_without_the_list_of_keys(overrides, message):
  """The error of a known key's bad value listed every ModelConfig field after it (as if the key were wrong;
  the config has already checked the keys): it now names the preset and overrides, and what is wrong."""
  with pytest.raises(ValueError) as bad:
    runtime.check_config(_cfg(**{"model.overrides": overrides}))
  assert str(bad.value) == message


def test_a_critic_overrides_max_seq_len_unlike_the_policys_context_is_refused():
  """A preset critic's `critic.overrides.max_seq_len` replaced the policy's context in its model and nothing read
  it: the critic scores the policy's rows (up to `model.max_seq_len` tokens), so a shorter one was silently run
  past its context (the learner's forward has no check) and a longer one changed nothing. It may now repeat
  `model.max_seq_len`, by the check `model.overrides` has."""
  with pytest.raises(ValueError) as refused:
    _gae_critic(init="preset", overrides={"max_seq_len": 16})
  assert str(refused.value) == (
      "In `config`: `critic.overrides.max_seq_len` = 16 and `model.max_seq_len` = 32 both set the critic's context "
      "and differ "
      "(the critic scores the policy's rows, so it has the policy's context); set it once: model.max_seq_len = 16, "
      "and drop max_seq_len from critic.overrides.")
  same = _gae_critic(init="preset", overrides={"max_seq_len": 32})
  runtime.check_config(same)
  assert _parts.critic_model_config(same, _policy_config(same)).max_seq_len == 32


@pytest.mark.parametrize("key, why", [
    ("tie_embeddings", "a critic reads its value head, never the vocabulary logits, so its vocabulary projection is "
     "tied to the embedding rather than kept as an untied lm_head nothing trains"),
    ("value_head", "a critic is a value model: its value head is what it trains"),
], ids=["tie_embeddings", "value_head"])
def test_a_critic_overrides_value_that_the_critics_model_replaces_is_refused(key, why):
  """`models.value_model_config` sets a critic's tie_embeddings and value_head to True: `critic.overrides` that
  set them False were silently replaced. They are refused with the reason; True (a repeat) is the same model."""
  with pytest.raises(ValueError) as refused:
    _gae_critic(init="preset", overrides={key: False})
  assert str(refused.value) == (f"In `config`: `critic.overrides.{key}` = False: a critic's model has {key} = True "
                                f"({why}); drop {key} from critic.overrides.")
  same = _gae_critic(init="preset", overrides={key: True})
  runtime.check_config(same)
  built = _parts.critic_model_config(same, _policy_config(same))
  assert built.tie_embeddings is True and built.value_head is True


def test_check_config_refuses_runtime_wandb_without_wandb_in_trains_one_line(monkeypatch):
  """`runtime.wandb = True` without the wandb package stopped `train` before any work, but `check-config` passed
  it: both now refuse it by one check (`_metrics.check_wandb`), in one line naming the extra to install."""
  wanted = _cfg(**{"runtime.wandb": True})
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails and find_spec finds none, as uninstalled
  with pytest.raises(ValueError) as refused:
    runtime.check_config(wanted)
  assert str(refused.value) == _metrics.WANDB_MISSING and "\n" not in str(refused.value)
  assert "pip install 'rlax-post[wandb]'" in str(refused.value)
  tokenizer = runtime.check_config(_cfg(**{"runtime.wandb": False}))  # (off: wandb is not asked for)
  assert isinstance(tokenizer, models.ByteTokenizer) and tokenizer.vocab_size == models.ByteTokenizer().vocab_size


def test_a_tool_task_context_that_holds_no_task_is_refused_not_searched_for_ever():
  """`model.max_seq_len` = 200 with `rl.max_new_tokens` = 40 (what the lengths check offers for 200) passed both
  checks, and the warm start then looked for a task whose demonstration fits 200 - slack tokens for ever (none of
  them does: the shortest has 319). The task's `lengths` now looks through the first training tasks and names the
  context that holds the shortest; the shipped config's context holds most of them."""
  cfg = _cfg("tools_tiny.py", **{"model.max_seq_len": 200, "rl.max_new_tokens": 40})
  message = ("`model.max_seq_len` = 200 holds no tool task's episode: none of the first 1000 training tasks' "
             "demonstrations (the shortest: 319 tokens) fits in it less task.options slack = 32 tokens, so the warm "
             "start and the rollouts would look for one for ever; set model.max_seq_len >= 351 (more, for more of "
             "the tasks).")
  assert _refusals(cfg) == (message, message)
  runtime.check_config(_cfg("tools_tiny.py", **{"model.max_seq_len": 351, "rl.max_new_tokens": 191}))


def test_a_wandb_setting_without_runtime_wandb_is_refused_as_unread():
  """`runtime.wandb_project` (verl's trainer.project_name, as the config's foreign keys say) without
  `runtime.wandb = True` was ignored: the run logged nothing to W&B, and nothing said so."""
  with pytest.raises(ValueError) as refused:
    _cfg(**{"runtime.wandb_project": "my-project"})
  assert str(refused.value).endswith(
      "`runtime.wandb_project` = 'my-project' (default None): read only with runtime.wandb = True; this run has "
      "runtime.wandb = False")
  assert _cfg(**{"runtime.wandb": True, "runtime.wandb_project": "my-project"}).runtime.wandb_project == "my-project"
  with pytest.raises(ValueError, match=r"`runtime.wandb_group` = 'g' \(default None\): read only with runtime.wandb"):
    _cfg(**{"runtime.wandb_group": "g"})  # (a sweep sets it only when every unit logs to W&B)


_HINT = (". Map those logical axes to different mesh axes (by default heads, KV heads, MLP and vocabulary over "
         "'tensor', the model width over 'fsdp', 'batch' over 'data' and 'fsdp').")


@pytest.mark.parametrize("rule, message", [
    (("heads", "fsdp"), "`mesh.rules` put one mesh axis on two dimensions of a weight of the model, which no mesh "
                        "can hold: leaf ['o']: mesh axis 'fsdp' is used twice in ('layers', 'heads', 'head_dim', "
                        "'embed') (by 'heads' and 'embed')"),
    (("batch", "tensor"), "`mesh.rules` put one mesh axis on two dimensions of the sampler's KV cache, which no "
                          "mesh can hold: leaf .k: mesh axis 'tensor' is used twice in ('layers', 'batch', "
                          "'kv_heads', 'head_dim', 'length') (by 'batch' and 'kv_heads')")])
def test_rules_that_put_a_mesh_axis_twice_on_one_array_are_refused_as_train_refuses_them(rule, message):
  """check-config passed them; `train` refused a weight's under its mesh's sizes ("cannot be placed on the mesh
  ...") and the KV cache's once its sampler was built, naming no setting ("leaf .cache.k: ...")."""
  rules = [[name, rule[1] if name == rule[0] else axes] for name, axes in sharding.DEFAULT_RULES]
  assert _refusals(_cfg(**{"mesh.rules": rules})) == (message + _HINT,) * 2
