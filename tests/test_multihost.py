"""Multi-host learner: `rlax-post learner` as 2 JAX processes × 4 CPU devices (coordinator on 127.0.0.1) with one
sampler process, checked against this test process (one process, 8 devices): the warm-start SFT's loss and
params, every logged RL metric (a single-process `replay` of the 2-process run's logged rollouts) and the final
checkpoint agree to 1e-5; only process 0 wrote the run's files. Plus the pieces: flag/env resolution, grain's
disjoint per-process rows, the broadcast payload of rollout groups."""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import portpicker
import pytest

import _procs  # pylint: disable=g-bad-import-order
from rlax_post import data
from rlax_post import envs
from rlax_post import models
from rlax_post import runtime
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _distributed
from rlax_post.runtime import _learners
from rlax_post.runtime import _metrics
from rlax_post.runtime import _parts
from rlax_post.runtime import _rowlog
from rlax_post.runtime import _warm

_TOL = 1e-5
_OVERRIDES = ["--config", "configs/demo.py:tiny", "--config.runtime.mode=async", "--config.eval.every=0",
              "--config.runtime.plot=False", "--config.checkpoint.max_to_keep=3",
              # The tiny warm start rarely solves a prompt (zero advantages): an entropy bonus gives every
              # RL step a non-zero loss and gradient to compare.
              "--config.loss.entropy_coef=0.01", "--quiet"]


# --- Joining the job ---------------------------------------------------------------------------------------


def test_resolve_flags_env_and_single():
  assert _distributed.resolve(environ={}) == _distributed.Topology(source="single")
  got = _distributed.resolve("10.0.0.1:1234", 2, 1, environ={"RLAX_NUM_PROCESSES": "9"})
  assert got == _distributed.Topology("flags", "10.0.0.1:1234", 2, 1)  # Flags win over env.
  env = {"RLAX_COORDINATOR_ADDRESS": "h:99", "RLAX_NUM_PROCESSES": "4", "RLAX_PROCESS_ID": "3"}
  assert _distributed.resolve(environ=env) == _distributed.Topology("env", "h:99", 4, 3)
  assert _distributed.resolve(num_processes=1, environ={}).source == "single"
  slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
           "SLURM_LOCALID": "0"}  # A task of `srun -n 2`: what JAX reads.
  assert _distributed.resolve(environ=slurm).source == "cluster"
  assert _distributed.resolve(environ={**slurm, "SLURM_NTASKS": "1"}).source == "single"
  # A batch script's own shell (no job step) is one process: JAX finds no job there (until 2026-12-06 this was a
  # cluster, and JAX's 'coordinator_address should be defined.' the learner's error); so is Open MPI without
  # the variable JAX finds its job by (Open MPI 5).
  batch = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}  # (sbatch --ntasks=4)
  assert _distributed.resolve(environ=batch).source == "single"
  assert _distributed.resolve(environ={"OMPI_COMM_WORLD_SIZE": "2"}).source == "single"
  ompi = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.0.0.1:34911"}
  assert _distributed.resolve(environ=ompi).source == "cluster"
  assert _distributed.resolve(environ={"TPU_WORKER_HOSTNAMES": "a,b"}).source == "cluster"
  assert _distributed.resolve(environ={"TPU_WORKER_HOSTNAMES": "a"}).source == "single"
  assert _distributed.resolve(environ=slurm, detect_cluster=False).source == "single"
  assert _distributed.resolve(environ={"RLAX_AUTO_DISTRIBUTED": "1"}).source == "cluster"


@pytest.mark.parametrize("args, env, match", [
    (("h:1", 2, 2), {}, r"--process_id must be in \[0, 2\)"),
    (("h:1", 2, -1), {}, r"--process_id must be in \[0, 2\)"),
    (("h:1", None, 0), {}, "--num_processes is required"),
    (("h:1", 2, None), {}, "--process_id is required"),
    ((None, 2, 0), {}, "--coordinator_address must be HOST:PORT"),
    (("nohostport", 2, 0), {}, "--coordinator_address must be HOST:PORT"),
    # A PORT that is no port: process 0 waited for its peers until JAX's 5-minute timeout (an empty one, 0,
    # 99999), or stopped in JaxRuntimeError's traceback ('abc').
    (("localhost:", 2, 0), {}, r"PORT in 1 \.\. 65535\) for a job of 2 processes; got 'localhost:'"),
    (("localhost:0", 2, 0), {}, "got 'localhost:0'"),
    (("localhost:99999", 2, 1), {}, "got 'localhost:99999'"),
    (("localhost:abc", 2, 0), {}, "got 'localhost:abc'"),
    ((None, None, None), {"RLAX_NUM_PROCESSES": "2", "RLAX_PROCESS_ID": "0", "RLAX_COORDINATOR_ADDRESS": ":8476"},
     "RLAX_COORDINATOR_ADDRESS must be HOST:PORT"),
    ((None, None, None), {"RLAX_NUM_PROCESSES": "2", "RLAX_PROCESS_ID": "5", "RLAX_COORDINATOR_ADDRESS": "h:1"},
     r"RLAX_PROCESS_ID must be in \[0, 2\)"),
    ((None, None, None), {"RLAX_NUM_PROCESSES": "two"}, "RLAX_NUM_PROCESSES must be an int"),
])
def test_resolve_rejects_inconsistent_settings(args, env, match):
  with pytest.raises(ValueError, match=match):
    _distributed.resolve(*args, environ=env)


def test_a_coordinator_port_in_use_is_one_clear_error():
  """Process 0 serves the coordinator's address: a port another program holds is a ValueError naming the flag and
  the address (the CLI's one line), not JaxRuntimeError's traceback ('Failed to start RPC server') or, one time
  in three, a segmentation fault inside JAX."""
  with socket.socket() as held:
    held.bind(("0.0.0.0", 0))
    held.listen()
    address = f"127.0.0.1:{held.getsockname()[1]}"
    code = ("from rlax_post import runtime\ntry:\n"
            f"  runtime.initialize_distributed({address!r}, 2, 0)\nexcept ValueError as e:\n  print(e)")
    out = subprocess.run([sys.executable, "-c", code], env=_env(1), capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  port = address.rpartition(":")[2]
  assert out.stdout == (f"--coordinator_address={address}: port {port} cannot be served on this machine, where "
                        "process 0 runs the job's coordinator (Address already in use); pick a free port.\n")


def test_a_cluster_jax_cannot_find_is_one_clear_error():
  """RLAX_AUTO_DISTRIBUTED=1 where JAX finds no job (here this CPU machine): the CLI's one line saying what to
  pass, not JAX's bare 'coordinator_address should be defined.'."""
  code = "from rlax_post import runtime\ntry:\n  runtime.initialize_distributed()\nexcept ValueError as e:\n  print(e)"
  out = subprocess.run([sys.executable, "-c", code], env=_env(1) | {"RLAX_AUTO_DISTRIBUTED": "1"},
                       capture_output=True, text=True, timeout=120)
  assert out.stdout == ("this process looks like one of a multi-process job (RLAX_AUTO_DISTRIBUTED, or a TPU pod's "
                        "variables), but jax.distributed could not set it up (coordinator_address should be defined.); "
                        "pass --coordinator_address, --num_processes and --process_id (or the RLAX_* variables), or "
                        "--num_processes=1 for one process.\n"), out.stderr[-2000:]


# --- Data ----------------------------------------------------------------------------------------------------


def test_sft_shards_are_disjoint_blocks_of_the_global_batch():
  task, tokenizer = envs.make_task("reverse"), models.ByteTokenizer()
  kw = dict(seed=3, batch_size=8, max_len=24, noise=0.5, num_eval=16)
  whole = data.sft_batches(task, tokenizer, **kw)
  shards = [data.sft_batches(task, tokenizer, shard_index=k, shard_count=2, **kw) for k in range(2)]
  seen = set()
  for _ in range(3):
    full, parts = next(whole), [next(s) for s in shards]
    assert [len(p["tokens"]) for p in parts] == [4, 4]
    rows = [set(p["example_index"].tolist()) for p in parts]
    assert not rows[0] & rows[1]  # Disjoint within the step ...
    assert not (rows[0] | rows[1]) & seen  # ... and from earlier steps.
    seen |= rows[0] | rows[1]
    for key in ("example_index", "tokens", "loss_mask"):  # Block k of the global batch, row for row.
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), full[key])
  with pytest.raises(ValueError, match="must divide batch_size"):
    data.sft_batches(task, tokenizer, shard_index=0, shard_count=3, **kw)


def test_row_shard_and_to_global_in_one_process():
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
  sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  assert _distributed.row_shard(sh, 16) == (0, 1)
  x = _distributed.to_global(np.arange(16, dtype=np.float64), sh, rows=16)
  assert x.dtype == np.float32 and x.sharding == sh
  np.testing.assert_array_equal(_distributed.to_host(x), np.arange(16))


def test_group_payload_round_trip():
  rows = [{"tokens": np.arange(5, dtype=np.int32), "reward": 0.5, "ticket": 7, "versions": [3, 3]},
          {"tokens": np.arange(2, dtype=np.int32), "reward": 1.0, "ticket": 7, "versions": [4]}]
  fresh, dropped, future, filtered = _rowlog.groups_from_payload(_rowlog.groups_payload(
      [("0000000007", rows, 1)], [("0000000002", 3), ("0000000009", 0)], ["0000000009"],
      [("0000000008", rows[:1])]))
  assert dropped == [("0000000002", 3), ("0000000009", 0)] and future == ["0000000009"]
  (fid, frows), = filtered  # dynamic sampling's drops reach every process, rows and all (their budget)
  assert fid == "0000000008" and len(frows) == 1 and frows[0]["reward"] == 0.5
  (gid, got, st), = fresh
  assert (gid, st, len(got)) == ("0000000007", 1, 2)
  np.testing.assert_array_equal(got[0]["tokens"], rows[0]["tokens"])
  assert got[0]["tokens"].dtype == np.int32 and got[1]["versions"] == [4] and got[1]["reward"] == 1.0


# --- Two learner processes -----------------------------------------------------------------------------------


def _env(devices: int | None):
  return _procs.env(devices or 1)


def _start_learners(workdir, tmp_path, *flags):
  """Two learner processes of one run (4 devices each) on a free port, logging to learner<k>.log; returns
  (processes, open logs)."""
  port = portpicker.pick_unused_port()
  logs, procs = [], []
  for k in range(2):
    logs.append(open(tmp_path / f"learner{k}.log", "w"))
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "rlax_post.cli", "learner", "--workdir", os.fspath(workdir), *_OVERRIDES, *flags,
         "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2", "--process_id", str(k)],
        env=_env(4), stdout=logs[-1], stderr=subprocess.STDOUT))
  return procs, logs


def _end(procs, logs):
  for p in procs:
    if p.poll() is None:
      p.kill()
  for f in logs:
    f.close()


def _run_two_process_learner(workdir, tmp_path):
  procs, logs = _start_learners(workdir, tmp_path)
  try:
    logs.append(open(tmp_path / "sampler.log", "w"))
    procs.append(subprocess.Popen([sys.executable, "-m", "rlax_post.cli", "sampler", "--workdir", workdir,
                                   "--index", "0", "--quiet"], env=_env(None), stdout=logs[-1],
                                  stderr=subprocess.STDOUT))
    for name, p in zip(("learner0.log", "learner1.log", "sampler.log"), procs):
      assert p.wait(timeout=240) == 0, (tmp_path / name).read_text()[-4000:]
  finally:
    _end(procs, logs)


def test_cli_rejects_a_process_id_outside_the_processes(tmp_path):
  bad = subprocess.run([sys.executable, "-m", "rlax_post.cli", "learner", "--workdir", os.fspath(tmp_path),
                        *_OVERRIDES, "--coordinator_address", "127.0.0.1:1", "--num_processes", "2",
                        "--process_id", "2"], env=_env(4), capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2
  assert "--process_id must be in [0, 2) for --num_processes=2; got 2." in bad.stderr


@pytest.mark.slow  # `make test-all` (make test's budget): two processes that join a JAX cluster, ~7 s
def test_train_on_two_processes_points_at_the_async_roles(tmp_path):
  """`train` samples inside the learner: on 2 processes it stops with a pointer to the async roles."""
  port = portpicker.pick_unused_port()
  procs = [subprocess.Popen([sys.executable, "-m", "rlax_post.cli", "train", "--workdir",
                             os.fspath(tmp_path / "sync"), "--config", "configs/demo.py:tiny", "--quiet",
                             "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
                             "--process_id", str(k)], env=_env(2), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for k in range(2)]
  for k, p in enumerate(procs):
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err[-2000:]
    assert f"runs in a single process; this is process {k} of 2" in err and "rlax-post learner" in err


@pytest.mark.e2e
@pytest.mark.slow  # `make test-all` (make test's budget): two learner processes and a sampler, 18 s
def test_a_signal_to_process_0_stops_every_learner_process_at_one_step(tmp_path):
  """Two learner processes, no sampler: process 0 waits for rollouts, process 1 in the broadcast of its groups.
  SIGTERM to process 0 alone ends both at the same step (process 0 broadcasts the stop): each exits 143 with
  the stop line, checkpoint 0 stays the run's, and no learner.done tells samplers to quit (a preemption)."""
  workdir = tmp_path / "run"
  grants = workdir / "admission" / "learner.json"
  procs, logs = _start_learners(workdir, tmp_path, "--config.sft.steps=0")
  try:
    mtime = lambda: os.stat(grants).st_mtime if grants.exists() else 0.0
    for _ in range(2):  # Its grant at the first publish, then one in its wait for rollouts.
      before, deadline = mtime(), time.time() + 240
      while mtime() <= before:
        assert all(p.poll() is None for p in procs) and time.time() < deadline, "the learners did not start"
        time.sleep(0.05)
    procs[0].send_signal(signal.SIGTERM)
    statuses = [p.wait(timeout=60) for p in procs]
  finally:
    _end(procs, logs)
  outs = [(tmp_path / f"learner{k}.log").read_text() for k in range(2)]
  assert statuses == [143, 143], [out[-2000:] for out in outs]
  line = (f"Stopped by SIGTERM after RL step 0 of 3: checkpoint 0 is saved in {workdir / 'checkpoints'}; "
          "the same command with --resume continues the run from it.\n")
  assert all(line in out for out in outs), [out[-2000:] for out in outs]
  assert runtime.complete_checkpoints(os.fspath(workdir)) == [0]
  assert not (workdir / "learner.done").exists() and not (workdir / "summary.json").exists()


def _close(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=_TOL, atol=_TOL),
               a, b)


@pytest.mark.e2e
@pytest.mark.slow  # Two learner processes and a one-process reference run: 55 s (`make test-all`; the budget).
def test_two_process_learner_matches_one_process(tmp_path):
  workdir = os.fspath(tmp_path / "run")
  _run_two_process_learner(workdir, tmp_path)

  # Process 0 alone wrote the run's files: one line per logged step, one TensorBoard event file.
  rows = _metrics.MetricsWriter(workdir, tensorboard=False).read()
  by_phase = {ph: [r["step"] for r in rows if r["phase"] == ph] for ph in ("sft", "rl", "eval")}
  assert by_phase == {"sft": [1, 2, 3, 4], "rl": [1, 2, 3], "eval": [0, 3]}  # (runtime.log_every = 1)
  assert len(glob.glob(os.path.join(workdir, "tensorboard", "events.*"))) == 1
  # Each evaluation's records once (process 0 evaluated and wrote them; the others got them broadcast).
  samples = runtime.read_jsonl(os.path.join(workdir, runtime.SAMPLES_FILE))
  examples = min(runtime.load_run_config(workdir).eval.samples, runtime.load_run_config(workdir).task.num_eval)
  assert [(r["step"], r["example"]) for r in samples] == [(s, j) for s in (0, 3) for j in range(examples)]
  with open(os.path.join(workdir, "schedule.jsonl")) as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2, 3]
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  assert summary["devices"] == 8 and summary["rl_steps_done"] == 3
  assert os.path.exists(os.path.join(workdir, "learner.done"))
  # Both processes print the run's (shared) eval line; only process 0, which wrote them, names the outputs.
  logs = [(tmp_path / f"learner{k}.log").read_text() for k in range(2)]
  eval_lines = [[l for l in log.splitlines() if l.startswith("Greedy eval reward on ")] for log in logs]
  assert len(eval_lines[0]) == 1 and [l.rsplit(" in ", 1)[0] for l in eval_lines[1]] == [
      eval_lines[0][0].rsplit(" in ", 1)[0]]  # (the same figures; each process its own seconds)
  outputs = "summary.json, metrics.jsonl, eval_samples.jsonl, tensorboard/, checkpoints/"  # (no curves.png: plot off)
  assert f"Outputs in {os.path.abspath(workdir)}: {outputs}\n" in logs[0], logs[0][-2000:]
  assert "Outputs in" not in logs[1], logs[1][-2000:]

  # One process, 8 devices: the same warm start from the same init ...
  cfg = runtime.load_run_config(workdir)
  parts = runtime.build_parts(cfg)
  params = _parts.initial_params(parts, _learners.key(cfg.seed, envs.Stream.INIT, 0))
  ref_dir = tmp_path / "one_process"
  ref_dir.mkdir()
  ref_metrics = _metrics.MetricsWriter(os.fspath(ref_dir), tensorboard=False)
  sft_params = _warm.warm_start(parts, params, ref_metrics, _metrics.Console(quiet=True))
  ref_sft, got_sft = ref_metrics.read(), [r for r in rows if r["phase"] == "sft"]
  assert [r["step"] for r in ref_sft] == [r["step"] for r in got_sft] == [1, 2, 3, 4]
  got_loss = np.asarray([r["loss"] for r in got_sft])
  assert np.all(np.isfinite(got_loss)) and np.all(got_loss > 0)
  np.testing.assert_allclose(got_loss, [r["loss"] for r in ref_sft], rtol=_TOL)

  # ... matches the post-SFT params in the 2-process run's first checkpoint (restored in this process),
  rl_update = runtime.RLUpdate(parts)
  ckpt = _checkpoint.RunCheckpointer(workdir)
  assert ckpt.complete_steps() == [0, 2, 3]
  restore = lambda step: ckpt.restore(step, **rl_update.checkpoint_templates)
  _, ref_params0, meta0 = restore(0)
  assert meta0["rl_step"] == 0
  _close(ref_params0, sft_params)

  # ... and re-running the RL steps on the logged rollouts gives every logged metric (losses, KL, grad norm,
  # advantages ...) and the final checkpoint's state.
  report = runtime.replay(workdir, quiet=True, tolerance=_TOL, return_state=True)
  assert report["mismatches"] == [] and report["compared_steps"] == 3
  rl_rows = [r for r in rows if r["phase"] == "rl"]
  assert all(r["loss"] != 0.0 and r["grad_norm"] > 0 for r in rl_rows)
  assert rl_rows[-1]["kl"] > 1e-9  # The policy moved away from the reference.
  state3, _, meta3 = restore(3)
  assert meta3["rl_step"] == 3
  _close(state3.params, report["state"].params)
  assert int(_distributed.to_host(state3.step)) == int(_distributed.to_host(report["state"].step)) == 3
  ckpt.close()


# --- A mesh across the data-centre network: granules are processes -----------------------------------------

_DCN_SCRIPT = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
from rlax_post import sharding
from rlax_post.runtime import _distributed
_distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
mesh = sharding.make_mesh({"data": 2, "fsdp": 4}, dcn={"data": 2})
procs = np.vectorize(lambda d: d.process_index)(mesh.devices)
# Each data row of the mesh is one process's 4 devices: fsdp's collectives stay inside a process (the
# "ICI" of this test), only the data axis crosses processes (its "DCN").
assert procs.shape == (2, 4, 1) and (procs[0] == 0).all() and (procs[1] == 1).all(), procs
# A real cross-process computation on that mesh: the batch split over data × fsdp, summed over both axes.
spec = jax.sharding.PartitionSpec(("data", "fsdp"))
x = jax.make_array_from_callback((16,), jax.sharding.NamedSharding(mesh, spec), lambda idx: np.arange(16.0)[idx])
total = jax.jit(jnp.sum, out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))(x)
print("TOTAL", float(total.addressable_data(0)))
try:
  sharding.make_mesh({"data": 2, "fsdp": 4}, dcn={"data": 4})
except ValueError as e:
  print("ERROR", e)
"""


@pytest.mark.e2e
def test_dcn_mesh_spans_processes(tmp_path):
  port = portpicker.pick_unused_port()
  procs = [subprocess.Popen([sys.executable, "-c", _DCN_SCRIPT, f"127.0.0.1:{port}", str(k)], env=_env(4),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(2)]
  for p in procs:
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-3000:]
    assert "TOTAL 120.0" in out
    assert "ERROR mesh axis 'data' of size 2 cannot span 4 granules" in out


_TWO_PUBLISHERS_SCRIPT = r"""
import os, sys
import jax, numpy as np
from rlax_post import exchange
from rlax_post.runtime import _distributed
_distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
params = lambda v: {"w": jax.make_array_from_callback((8,), sharded, lambda i: np.full(8, v, np.float32)[i])}
# As a multi-host learner with critic.publish: the policy's and the critic's params published as one version.
policy = exchange.ParamPublisher(os.path.join(sys.argv[3], "params"), max_to_keep=2)
critic = exchange.ParamPublisher(os.path.join(sys.argv[3], "critic_params"), max_to_keep=2)
for version in (1, 2, 3):
  policy.publish(params(version), version)
  critic.publish(params(-version), version)
policy.close()
critic.close()
print("VERSIONS", policy.latest_version, critic.latest_version)
"""


@pytest.mark.e2e
def test_two_publishers_of_one_version_commit_across_processes(tmp_path):
  """Each publisher's orbax barriers have a prefix of its own: a run's params and its critic's, published as the
  same version, joined one barrier named after the version ('already ongoing') and hung."""
  port = portpicker.pick_unused_port()
  procs = [subprocess.Popen([sys.executable, "-c", _TWO_PUBLISHERS_SCRIPT, f"127.0.0.1:{port}", str(k),
                             str(tmp_path)], env=_env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for k in range(2)]
  try:
    for p in procs:
      out, err = p.communicate(timeout=120)
      assert p.returncode == 0, err[-3000:]
      assert "VERSIONS 3 3" in out
  finally:
    for p in procs:  # a hung process (the bug) must not outlive the test
      p.kill()
