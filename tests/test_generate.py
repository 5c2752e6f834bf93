"""`rlax-post generate`: a checkpoint's completions of the user's prompts through the sampler's `Driver`, in process.

One tiny run is trained per module. Greedy completions equal a plain full-forward argmax loop over the params
`serve` loads (`_serving.greedy_loop`) and `rlax-post evaluate`'s completions of the held-out prompts; each
sample's sum logprob equals the model's own log-probabilities of its tokens; bad input is one line naming it.
"""

import json
import os

import _cli_forks
import _procs
import _serving
import _tiny_hf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import config as config_lib
from rlax_post import envs
from rlax_post import models
from rlax_post import runtime
from rlax_post import sampler
from rlax_post.runtime import _generate
from rlax_post.runtime import _serve

pytestmark = pytest.mark.e2e

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = os.path.join(_ROOT, "configs", "demo.py")
_ENV = _procs.env()
_GOOD = ["rev abc=", "rev bad=", "rev hgfe=", "rev cab="]
_BYTES = models.ByteTokenizer()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A tiny run (`--config.rl.steps=1`: checkpoints 0 and 1), its params moved off the warm start's by an
  entropy bonus and a larger learning rate (as tests/test_serve.py's)."""
  workdir = tmp_path_factory.mktemp("generate") / "run"
  train = _cli_forks.run(
      "train", "--config", _CONFIG + ":tiny", "--workdir", workdir, "--quiet", "--config.rl.steps=1",
      "--config.loss.entropy_coef=0.01", "--config.rl.optimizer.learning_rate=0.01", cwd=_ROOT, timeout=300, env=_ENV)
  assert train.returncode == 0, train.stderr[-3000:]
  return str(workdir)


def _cli(*args, cwd=_ROOT):
  return _cli_forks.run("generate", *map(str, args), cwd=cwd, env=_ENV, timeout=300)


def _error(out) -> str:
  assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert lines[0].startswith("rlax-post generate: error: "), lines[0]
  return lines[0][len("rlax-post generate: error: "):]


def _prompts(*texts):
  return [runtime.UserPrompt(f"--prompt {i}", t) for i, t in enumerate(texts, 1)]


def test_greedy_completions_equal_the_full_forward_argmax_loop_with_their_logprobs(run):
  engine = _serve.engine_from_workdir(run)
  params = engine.load_params()
  want = _serving.greedy_loop(engine.graphdef, params, _GOOD, 6, _BYTES)
  assert all(want), "a reference decodes EOS at once: the comparison would be vacuous"
  got = runtime.generate_run(run, _prompts(*_GOOD), runtime.GenerateOptions(max_tokens=6))
  assert got.step == 1 and got.source == f"step 1 of {run}"
  assert [(g.prompt_index, g.sample) for g in got.samples] == [(i, 0) for i in range(len(_GOOD))]
  forward = jax.jit(lambda p, t: models.forward(engine.graphdef, p, t)[0])
  for g, text, ref in zip(got.samples, _GOOD, want):
    # The loop stops before EOS; the completion keeps it (finish "eos") or runs to max_tokens ("length").
    assert g.tokens == tuple(ref) + ((_BYTES.eos_id,) if len(ref) < 6 else ()), (text, g.tokens, ref)
    assert g.finish_reason == ("eos" if len(ref) < 6 else "length")
    assert g.completion == _BYTES.decode(ref) and g.prompt == text
    assert g.rendered == _BYTES.decode(_BYTES.encode(text, add_bos=True), skip_special=False, stop_at_eos=False)
    # Sum logprob: the model's log softmax (temperature 1 when greedy) at each generated token.
    seq = _BYTES.encode(text, add_bos=True) + list(g.tokens)
    logp = jax.nn.log_softmax(forward(params, jnp.asarray([seq]))[0].astype(jnp.float32), axis=-1)
    n = len(seq) - len(g.tokens)
    ref_sum = sum(float(logp[n - 1 + t, tok]) for t, tok in enumerate(g.tokens))
    np.testing.assert_allclose(g.sum_logprob, ref_sum, rtol=1e-4, atol=1e-4)


def test_the_cli_s_greedy_completions_equal_evaluate_s_and_its_out_records_them(run, tmp_path):
  """`rlax-post evaluate` writes each held-out prompt and greedy completion; `generate` of those prompts (the run's
  rl.max_new_tokens by default) writes the same completions, one JSON line per (prompt, sample)."""
  evaluated = tmp_path / "eval.jsonl"
  out = _cli_forks.run("evaluate", "--workdir", run, "--step", "1", "--out", evaluated, cwd=_ROOT, env=_ENV,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  records = [json.loads(line) for line in evaluated.read_text().splitlines()]
  assert len(records) == 16 and all(r["completion"] for r in records)  # (the tiny run's held-out set)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("".join(r["prompt"].removeprefix("<bos>") + "\n" for r in records))
  generated = tmp_path / "sub" / "generated.jsonl"
  out = _cli("--checkpoint", run, "--step", 1, "--prompts", prompts, "--out", generated)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = [json.loads(line) for line in generated.read_text().splitlines()]
  assert [g["rendered_prompt"] for g in lines] == [r["prompt"] for r in records]
  assert [g["completion"] for g in lines] == [r["completion"] for r in records]
  assert all(g["step"] == 1 and g["sample"] == 0 and len(g["tokens"]) <= 8 for g in lines)
  assert [g["prompt_index"] for g in lines] == list(range(len(records)))
  # Printed: each prompt as the model sees it, then its sample.
  assert out.stdout.startswith(f"step 1 of {run}: {len(records)} prompt(s) x 1 sample(s).")
  first = lines[0]
  assert (f"=== prompt 1 of {len(records)}, as the model sees it:\n{first['rendered_prompt']}\n--- sample 1 of 1: "
          f"{first['finish_reason']}, {len(first['tokens'])} tokens, sum logprob {first['sum_logprob']:.4f}\n"
          f"{first['completion']}\n") in out.stdout
  assert out.stdout.rstrip().endswith(f"Wrote {len(records)} samples to {generated}.")
  # An existing --out is refused, as evaluate's is.
  assert _error(_cli("--checkpoint", run, "--prompt", "rev a=", "--out", generated)) == (
      f"--out {str(generated)!r} exists; pass a new file path (an earlier output is not replaced), or remove it.")


def test_the_engine_queues_samples_only_where_they_outnumber_its_slots():
  """The refill queue holds rows of the whole context: `generate` asks for one (the engine's default) only where
  the samples outnumber its slots, where the driver queues the rest; none where every sample has a slot."""
  law = sampler.SamplingLaw(temperature=1.0)
  got = [(o.max_concurrent_decodes, o.refill_queue) for o in (
      _generate._engine_options(runtime.GenerateOptions(samples=samples, law=law), prompts)
      for prompts, samples in ((1, 1), (2, 4), (3, 3), (9, 1)))]
  assert got == [(1, 0), (8, 0), (8, None), (8, None)]


def test_sampled_completions_follow_their_seed_and_streams(run):
  """Temperature 1: sample j of prompt i draws from stream (i, j) of the seed; top_k 1 is the greedy law."""
  sample = lambda texts, samples=1, **law: [g.tokens for g in runtime.generate_run(
      run, _prompts(*texts), runtime.GenerateOptions(max_tokens=6, samples=samples,
                                                     law=sampler.SamplingLaw(temperature=1.0, **law))).samples]
  two = sample(_GOOD[:2], samples=3, seed=7)
  assert len(two) == 6 and len(set(two)) > 1  # (samples of one prompt differ)
  assert sample(_GOOD[:1], samples=3, seed=7) == two[:3]  # prompt 0's streams, whatever comes after it
  assert sample(_GOOD[:1], samples=3, seed=8) != two[:3]
  greedy = [g.tokens for g in runtime.generate_run(run, _prompts(*_GOOD[:2]),
                                                   runtime.GenerateOptions(max_tokens=6)).samples]
  assert sample(_GOOD[:2], top_k=1) == greedy


def test_a_dataset_run_s_renderer_writes_its_system_prompt_and_chat_template():
  """A dataset run's prompts: its system prompt and chat template (here a hand-written one) over the text or
  the messages, no BOS added (the template writes what it wants); --raw: the text with BOS."""
  section = config_lib.DataSection(system_prompt="Be brief.",
                                   chat_template="{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                                                 "{% if add_generation_prompt %}[assistant] {% endif %}")
  renderer = envs.Renderer(section, _BYTES, demos=False)
  text = runtime.UserPrompt("--prompt", "rev abc=")
  want = "[system] Be brief.\n[user] rev abc=\n[assistant] "
  assert _generate.prompt_ids(renderer, _BYTES, text) == _BYTES.encode(want, add_bos=False)
  chat = runtime.UserPrompt("f.jsonl:1", ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                          {"role": "user", "content": "rev ab="}))
  want = "[system] Be brief.\n[user] hi\n[assistant] yo\n[user] rev ab=\n[assistant] "
  assert _generate.prompt_ids(renderer, _BYTES, chat) == _BYTES.encode(want, add_bos=False)
  assert _generate.prompt_ids(None, _BYTES, text) == _BYTES.encode("rev abc=", add_bos=True)
  with pytest.raises(ValueError, match=r"^f.jsonl:1: chat messages need a chat template to be rendered, and the "
                                       r"text is sent as it is \(--raw, or a run of a built-in task"):
    _generate.prompt_ids(None, _BYTES, chat)
  plain = envs.Renderer(config_lib.DataSection(system_prompt="Be brief."), _BYTES, demos=False)  # no template
  assert _generate.prompt_ids(plain, _BYTES, text) == _BYTES.encode("Be brief.\n\nrev abc=", add_bos=True)
  with pytest.raises(ValueError, match="this source renders no chat template"):
    _generate.prompt_ids(plain, _BYTES, chat)


@pytest.mark.parametrize("name, text, error", [
    ("p.txt", "", "--prompts '{path}' holds no prompt (it is empty or blank); write one prompt per line."),
    ("p.txt", "\n  \n", "--prompts '{path}' holds no prompt (it is empty or blank); write one prompt per line."),
    ("p.csv", "a\n", "--prompts '{path}' must be a .txt file"),
    ("p.jsonl", '{"prompt": "a"}\n\n[1, 2]\n', "{path}:3: a JSON list, not an object;"),
    ("p.jsonl", '{"prompt": "a"}\n{"prompt": \n', "{path}:2: not a JSON object (Expecting value"),
    ("p.jsonl", '{"text": "a"}\n', "{path}:1: an object needs exactly one of the fields \"prompt\" (a string) and "
     "\"messages\" (a list of chat messages); it has neither (its fields: ['text'])."),
    ("p.jsonl", '{"prompt": "a", "messages": []}\n', "{path}:1: an object needs exactly one of the fields"),
    # (Messages as a string were read as a text prompt until 2026-12-06.)
    ("p.jsonl", '{"prompt": "a"}\n{"messages": "some text"}\n', "{path}:2: \"messages\" must be a list of "
     "{{\"role\": ..., \"content\": ...}} objects (chat messages); got a JSON string ('some text'); a text prompt "
     "goes in \"prompt\"."),
    ("p.jsonl", '{"messages": {"role": "user", "content": "x"}}\n', "{path}:1: \"messages\" must be a list of "
     "{{\"role\": ..., \"content\": ...}} objects (chat messages); got a JSON object ({{'role': 'user', "),
])
def test_a_bad_prompts_file_is_named_with_its_line(tmp_path, name, text, error):
  path = tmp_path / name
  path.write_text(text)
  with pytest.raises(ValueError) as info:
    runtime.read_prompts(str(path))
  assert str(info.value).startswith(error.format(path=path)), str(info.value)


def test_prompts_files_read_lines_and_json_objects_and_their_prompts_are_checked(tmp_path):
  txt = tmp_path / "p.txt"
  txt.write_text("rev a=\n\nrev bc=\r\n")
  assert runtime.read_prompts(str(txt)) == [runtime.UserPrompt(f"{txt}:1", "rev a="),
                                            runtime.UserPrompt(f"{txt}:3", "rev bc=")]
  jsonl = tmp_path / "p.jsonl"
  jsonl.write_text('{"prompt": "rev a="}\n{"messages": [{"role": "user", "content": "x"}]}\n{"prompt": ""}\n'
                   '{"messages": [{"role": "user"}]}\n')
  read = runtime.read_prompts(str(jsonl))
  assert read[:2] == [runtime.UserPrompt(f"{jsonl}:1", "rev a="),
                      runtime.UserPrompt(f"{jsonl}:2", ({"role": "user", "content": "x"},))]
  with pytest.raises(ValueError, match=f"^{jsonl}:3: the prompt '' is empty; give it some text.$"):
    _generate.check_prompts(read)
  with pytest.raises(ValueError, match=rf"^{jsonl}:4: a prompt is a string or a non-empty list of"):
    _generate.check_prompts(read[3:])
  # Lines end at "\n" alone, as in the run's files: a form feed or U+2028 (which JSON strings may hold raw) cut
  # one prompt in two, or a valid .jsonl line in two halves "not a JSON object"; a BOM began the first prompt.
  txt.write_bytes("\ufeffa\fb\r\n\nc\u2028d\x1de\n".encode())
  assert runtime.read_prompts(str(txt)) == [runtime.UserPrompt(f"{txt}:1", "a\fb"),
                                            runtime.UserPrompt(f"{txt}:3", "c\u2028d\x1de")]
  jsonl.write_bytes(("\ufeff" + json.dumps({"prompt": "x\u2028y\fz"}, ensure_ascii=False) + "\r\n").encode())
  assert runtime.read_prompts(str(jsonl)) == [runtime.UserPrompt(f"{jsonl}:1", "x\u2028y\fz")]


def test_prompts_that_do_not_fit_the_context_are_named(run):
  """The tiny model's context is 32 tokens: BOS + 26 bytes + 6 tokens fit nothing more."""
  fits = "rev " + "a" * 21 + "="  # BOS + 26 = 27 tokens, 5 left
  with pytest.raises(ValueError, match=r"^--prompt 2: the prompt renders to 27 tokens, and with --max_tokens 6 they "
                     r"need 33 positions, more than the context of 32; shorten it or pass --max_tokens 5 or less\.$"):
    runtime.generate_run(run, _prompts("rev a=", fits), runtime.GenerateOptions(max_tokens=6))
  # No --max_tokens: the run's rl.max_new_tokens (8) is named as such, not as a --max_tokens the user never gave.
  with pytest.raises(ValueError, match=r"^--prompt 2: the prompt renders to 27 tokens, and with the run's "
                     r"rl.max_new_tokens 8 \(the default of --max_tokens\) they need 35 positions, more than the "
                     r"context of 32; shorten it or pass --max_tokens 5 or less\.$"):
    runtime.generate_run(run, _prompts("rev a=", fits))
  with pytest.raises(ValueError, match=r"^--prompt 1: the prompt renders to 33 tokens, .* shorten it \(it leaves no "
                     r"position to generate into\)\.$"):
    runtime.generate_run(run, _prompts("rev " + "a" * 27 + "="), runtime.GenerateOptions(max_tokens=1))
  with pytest.raises(ValueError, match=r"^--max_tokens 32 does not fit the context of 32 tokens \(prompt and "
                     r"completion\); pass at most 31\.$"):
    runtime.generate_run(run, _prompts("rev a="), runtime.GenerateOptions(max_tokens=32))


@pytest.mark.parametrize("flags, error", [
    ((), "generate needs exactly one of --checkpoint RUN_WORKDIR"),
    (("--checkpoint", "{run}", "--max_seq_len", "64", "--prompt", "a"),
     "--max_seq_len 64 goes with --hf_path; a run's workdir is sampled with its own model.max_seq_len."),
    (("--checkpoint", "{run}"), "generate needs --prompt TEXT (repeatable) or --prompts FILE"),
    (("--checkpoint", "{run}", "--prompt", "a", "--prompts", "p.txt"), "generate needs --prompt TEXT"),
    (("--checkpoint", "{run}", "--prompts", "missing.txt"), "--prompts 'missing.txt': cannot read it (No such file"),
    (("--checkpoint", "{run}", "--prompt", "a", "--prompt", " "),
     "--prompt 2: the prompt ' ' is empty; give it some text."),
    (("--checkpoint", "{run}", "--prompt", "a", "--max_tokens", "0"), "--max_tokens must be an int >= 1; got 0."),
    (("--checkpoint", "{run}", "--prompt", "a", "--samples", "0"), "--samples must be an int >= 1; got 0."),
    (("--checkpoint", "{run}", "--prompt", "a", "--samples", "2"),
     "--samples 2 with --temperature 0: greedy sampling gives every sample the same tokens;"),
    (("--checkpoint", "{run}", "--prompt", "a", "--temperature", "-1"),
     "--temperature must be 0 (greedy) or a number in [1e-05, 100]; got -1.0."),
    (("--checkpoint", "{run}", "--prompt", "a", "--temperature", "1", "--top_p", "0"),
     "--top_p must be a number in (0, 1]; got 0.0."),
    (("--checkpoint", "{run}", "--prompt", "a", "--seed", "-1"), "--seed must be an int in [0, 2**32)"),
    (("--checkpoint", "{run}", "--prompt", "a", "--step", "5"),
     "--step 5: run {run} holds no complete checkpoint of that step; its complete steps: ["),
    (("--checkpoint", "{run}", "--prompt", "a", "--dtype", "int8"), "--dtype 'int8' is not a dtype the served model"),
    (("--checkpoint", "{run}", "--prompt", "a", "--port", "1"), "--port is not a flag of `rlax-post generate`"),
])
def test_bad_flags_are_one_line_naming_the_value(run, flags, error):
  line = _error(_cli(*(f.format(run=run) for f in flags)))
  assert line.startswith(error.replace("{run}", str(run))), line


def test_a_hugging_face_checkpoint_renders_with_its_chat_template_and_raw_sends_the_text(tmp_path):
  """`--hf_path`: the checkpoint's chat template (it writes BOS), messages too; `--raw`: the text with BOS, whose
  greedy completion is the full-forward argmax loop's."""
  path = _tiny_hf.make_checkpoint(str(tmp_path / "hf"))
  engine = _serve.engine_from_hf(path, max_seq_len=32)
  tok = engine.tokenizer
  options = runtime.GenerateOptions(max_tokens=4)
  chat = ({"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"},
          {"role": "user", "content": "1+2="})
  got = runtime.generate_hf(path, [runtime.UserPrompt("--prompt", "3+4="), runtime.UserPrompt("f:1", chat)],
                            options, max_seq_len=32)
  assert got.step is None and got.source == f"the Hugging Face checkpoint {path}"
  assert [g.rendered for g in got.samples] == [
      "<|begin|><|user|>3+4=<|eot|><|assistant|>",
      "<|begin|><|user|>3+4=<|eot|><|assistant|>7<|eot|><|user|>1+2=<|eot|><|assistant|>"]
  raw = runtime.generate_hf(path, [runtime.UserPrompt("--prompt", "3+4=")],
                            runtime.GenerateOptions(max_tokens=4, raw=True), max_seq_len=32).samples[0]
  assert raw.rendered == "<|begin|>3+4="
  want = _serving.greedy_loop(engine.graphdef, engine.load_params(), ["3+4="], 4, tok)[0]
  assert raw.tokens == tuple(want) + ((tok.eos_id,) if len(want) < 4 else ())
  # Without --max_tokens: 128 tokens, or the room the context leaves after the prompt (the 32-token context of
  # this checkpoint refused every prompt with the default 128 until 2026-12-06).
  room = 32 - len(tok.encode("3+4=", add_bos=True))
  whole = runtime.generate_hf(path, [runtime.UserPrompt("--prompt", "3+4=")], runtime.GenerateOptions(raw=True),
                              max_seq_len=32).samples[0]
  want = _serving.greedy_loop(engine.graphdef, engine.load_params(), ["3+4="], room, tok)[0]
  assert whole.tokens == tuple(want) + ((tok.eos_id,) if len(want) < room else ())
  # A checkpoint directory holds one model: --step (a number or best) is refused, as by `serve --hf_path`; it was
  # ignored until 2026-12-06 (the sample came from the one model whatever step was asked).
  for step in (3, "best"):
    with pytest.raises(ValueError, match=rf"^--step {step} picks a checkpoint of a run's workdir \(--checkpoint\); "
                       rf"the Hugging Face checkpoint directory '{path}' holds one model: leave --step out\.$"):
      runtime.generate_hf(path, [runtime.UserPrompt("--prompt", "3+4=")],
                          runtime.GenerateOptions(step=step, max_tokens=4), max_seq_len=32)
