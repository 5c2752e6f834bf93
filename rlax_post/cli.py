"""`rlax-post`: the command-line entry point.

  rlax-post train --config configs/demo.py[:variant] [--config.a.b=value ...] --workdir DIR [--resume]
  rlax-post check-config --config configs/demo.py[:variant] [--config.a.b=value ...]
  rlax-post serve --checkpoint RUN_WORKDIR --port 9000 [--host 127.0.0.1] [--temperature 0] [--slots 8]
  rlax-post learner --config configs/demo.py[:variant] [--config.runtime.max_staleness=2 ...] --workdir DIR
  rlax-post sampler --workdir DIR --index K        # any number of them, each with its own K
  rlax-post replay --workdir DIR                   # re-runs an async run's learner from its logged rollouts
  rlax-post sweep --config configs/X.py[:variant] [--config.a.b=value ...] --workdir ROOT [--parallel N]

`train` runs the learner loop with sampling inline (`runtime.mode = "sync"`) or in sampler threads ("async").
`learner` and `sampler` are the async roles as separate processes (or hosts) sharing DIR (docs/async.md).
"""

from __future__ import annotations

import json
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from rlax_post import config as config_lib
from rlax_post import runtime
from rlax_post import sampler
from rlax_post import sweep

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file, optionally :variant.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and summaries.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run in --workdir from its latest checkpoint.")
_QUIET = flags.DEFINE_bool("quiet", False, "No progress bars or status lines.")

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "serve: the workdir of a training run (config.json and "
                                  "checkpoints/); its newest checkpoint is served.")
_PORT = flags.DEFINE_integer("port", 9000, "serve: gRPC port.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "serve: address to listen on.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "serve: sampling temperature (0: greedy).")
_SLOTS = flags.DEFINE_integer("slots", 8, "serve: concurrent decodes (engine slots).")
_INDEX = flags.DEFINE_integer("index", None, "sampler: this sampler's index (0, 1, ...; unique per sampler).")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "sweep: work units run at the same time.")
_PIN_CPUS = flags.DEFINE_bool("pin_cpus", True, "sweep: give each concurrent unit its own share of the CPUs.")
_JSON = flags.DEFINE_string("json", None, "sweep: also write the figures of sweep.json to this path.")
_SHARE_WARM = flags.DEFINE_bool("share_warm_start", True, "sweep: units with the same warm start (seed, task, "
                                "model, sft) compute it once (--config.sft.cache_dir=ROOT/warm_start_cache).")
# Multi-host learner (docs/launch.md, section 4); else RLAX_COORDINATOR_ADDRESS / _NUM_PROCESSES / _PROCESS_ID.
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "learner, replay: HOST:PORT of process 0 of a "
                                   "multi-process learner.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "learner, replay: processes of the learner.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "learner, replay: this process's index (0 .. N-1).")
_DISTRIBUTED_COMMANDS = ("train", "learner", "replay")  # Samplers are single-process JAX programs.


def _init_distributed(command: str):
  """Joins a multi-process job (flags, RLAX_* env; for the learner roles also a detected cluster)."""
  runtime.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                                 detect_cluster=command != "train")


COMMANDS = ("train", "check-config", "serve", "learner", "sampler", "replay", "sweep")


def _load_config():
  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. --config configs/demo.py")
  return config_lib.load(_CONFIG.value)


def _train(argv):
  del argv
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required.")
  summary = runtime.train(_load_config(), _WORKDIR.value, resume=_RESUME.value, quiet=_QUIET.value)
  _print_summary(summary)


def _print_summary(summary):
  initial, final = summary["initial_eval_reward"], summary["final_eval_reward"]
  print(f"\nGreedy eval reward on {summary['num_eval_prompts']} held-out prompts: warm start {initial:.3f} "
        f"-> after RL {final:.3f} ({final - initial:+.3f}) in {summary['wall_seconds']:.0f} s.")
  print(f"Outputs in {summary['workdir']}: summary.json, metrics.jsonl, curves.png, tensorboard/, "
        "checkpoints/")


def _learner(argv):
  del argv
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required.")
  if _CONFIG.value is not None:
    cfg = _load_config()
  else:  # A restarted learner may take the run's own config.
    cfg = runtime.load_run_config(_WORKDIR.value)
  if cfg.runtime.mode != "async":
    raise ValueError("`rlax-post learner` runs the async learner: set --config.runtime.mode=async.")
  _print_summary(runtime.run_learner(cfg, _WORKDIR.value, resume=_RESUME.value, quiet=_QUIET.value))


def _sampler(argv):
  del argv
  if not _WORKDIR.value or _INDEX.value is None:
    raise app.UsageError("--workdir and --index are required.")
  runtime.run_sampler(_WORKDIR.value, index=_INDEX.value, quiet=_QUIET.value)


def _replay(argv):
  del argv
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required.")
  report = runtime.replay(_WORKDIR.value, quiet=_QUIET.value)
  if report["mismatches"]:
    for step, key, want, got in report["mismatches"][:20]:
      print(f"step {step}: {key} logged {want!r} replayed {got!r}")
    raise ValueError(f"replay differs from the logged run in {len(report['mismatches'])} values.")
  print(f"replay: {report['steps']} steps re-run from the logged rollouts; the metrics of "
        f"{report['compared_steps']} logged steps match exactly.")


def _sweep(argv, overrides):
  """Runs the config's work units as local `rlax-post train` processes; prints their table."""
  del argv
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required: the root under which each work unit gets its workdir.")
  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. --config configs/tools_tiny.py")
  spec = flags.FLAGS["config"].config_filename
  say = (lambda *a, **k: None) if _QUIET.value else (lambda msg: print(msg, flush=True))
  results = sweep.run_local(spec, _WORKDIR.value, parallel=_PARALLEL.value, extra_flags=overrides,
                            pin_cpus=_PIN_CPUS.value, share_warm_start=_SHARE_WARM.value, say=say)
  sweep.write_report(results, _WORKDIR.value, config=spec, json_path=_JSON.value)
  print(sweep.table(results))
  print(f"\nOutputs in {_WORKDIR.value}: sweep.json, sweep.png, and one workdir per unit.")
  failed = [r.unit.name for r in results if not r.ok]
  if failed:
    raise ValueError(f"{len(failed)} of {len(results)} work units failed: {failed}; see their train.log.")


def _check_config(argv):
  del argv
  print(json.dumps(config_lib.to_dict(_load_config()), indent=2))


def _serve(argv):
  del argv
  if not _CHECKPOINT.value:
    raise app.UsageError("--checkpoint is required: the workdir of a training run.")
  options = sampler.ServeOptions(port=_PORT.value, host=_HOST.value, max_concurrent_decodes=_SLOTS.value,
                                 temperature=_TEMPERATURE.value)
  server = runtime.serve(_CHECKPOINT.value, options)
  print(f"Serving {_CHECKPOINT.value} with JetStream on {_HOST.value}:{_PORT.value}", flush=True)
  server.wait_for_termination()


def main(argv=None):
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] not in COMMANDS:
    got = argv[1] if len(argv) > 1 else None
    print(f"usage: rlax-post {{{','.join(COMMANDS)}}} --config FILE [--config.key=value ...] [flags]\n"
          f"unknown or missing command {got!r}; valid commands: {list(COMMANDS)}", file=sys.stderr)
    sys.exit(2)
  command = argv.pop(1)
  handler = {"train": _train, "check-config": _check_config, "serve": _serve, "learner": _learner,
             "sampler": _sampler, "replay": _replay}.get(command)
  if command == "sweep":  # The units get the command line's --config.key=value overrides too.
    try:
      overrides = sweep.command_line_overrides(argv[1:])
    except ValueError as e:
      print(f"rlax-post sweep: {e}", file=sys.stderr)
      sys.exit(2)
    handler = lambda args: _sweep(args, overrides)  # pylint: disable=unnecessary-lambda-assignment

  def run(args):
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # Orbax and grain log every step at INFO.
    try:
      if command in _DISTRIBUTED_COMMANDS:
        _init_distributed(command)  # Before anything touches a JAX backend.
      handler(args)
    except (ValueError, FileNotFoundError) as e:  # Config and input errors: one clear line, no traceback.
      print(f"rlax-post {command}: error: {e}", file=sys.stderr)
      sys.exit(2)

  app.run(run, argv=argv)


if __name__ == "__main__":
  main()
