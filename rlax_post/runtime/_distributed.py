"""Multi-host learners: `jax.distributed` start-up, per-process batch rows, host copies, process-0 duties.

A multi-host learner is one JAX program run by N processes (one per host, or several per host on the CPU),
each owning its local devices; the mesh spans `jax.devices()` (all of them). The helpers here are no-ops in a
single process, so the same runtime code serves both (docs/launch.md, section 4):

  * `initialize` joins the job from flags, from `RLAX_*` variables, or from a cluster JAX detects;
  * `row_shard` / `to_global` put a batch on the mesh from the rows this process holds;
  * `to_host` reads a (possibly non-addressable) array back on every process;
  * `broadcast_bytes` / `broadcast_float` hand process 0's host data (rollout groups, eval scores) to all;
  * `gather_flags` gives every process each one's yes or no (did its part of a checkpoint restore);
  * `PrimaryEval` runs the learner's greedy eval on process 0's devices only.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
from typing import Any, Callable, Mapping

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

ENV_COORDINATOR = "RLAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "RLAX_NUM_PROCESSES"
ENV_PROCESS_ID = "RLAX_PROCESS_ID"
# Set to 1 to let JAX find the job itself (`jax.distributed.initialize()` without arguments).
ENV_AUTO = "RLAX_AUTO_DISTRIBUTED"
# What JAX reads to find a SLURM job step (`srun`) and an Open MPI job (`mpirun` of Open MPI 4); without them it
# finds neither (jax/_src/clusters/slurm_cluster.py, ompi_cluster.py).
_SLURM_STEP = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
_OMPI_URI = "OMPI_MCA_orte_hnp_uri"


@dataclasses.dataclass(frozen=True)
class Topology:
  """How this process joins the job. `source`: 'flags', 'env', 'cluster' (JAX auto-detects) or 'single'."""
  source: str
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None


def _as_int(name: str, value: Any) -> int | None:
  if value is None or value == "":
    return None
  try:
    return int(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be an int; got {value!r}.") from None


def _cluster_detected(environ: Mapping[str, str]) -> bool:
  """Whether a multi-process launcher that `jax.distributed.initialize()` understands set up this process.

  Cloud TPU pods (GCE or GKE: `TPU_WORKER_HOSTNAMES` or `MEGASCALE_COORDINATOR_ADDRESS`), a SLURM job step
  (`srun`) of several tasks, Open MPI 4's `mpirun` of several ranks (each as JAX finds it: a batch script's
  own shell, with SLURM_NTASKS but no step, is one process); anything else JAX detects (e.g. the TPU metadata
  server, Kubernetes indexed jobs) is opted into with RLAX_AUTO_DISTRIBUTED=1.
  """
  if environ.get(ENV_AUTO, "") not in ("", "0"):
    return True
  if environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return True
  if len([h for h in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1:
    return True
  if all(k in environ for k in _SLURM_STEP) and (_as_int("SLURM_NTASKS", environ["SLURM_NTASKS"]) or 1) > 1:
    return True
  return _OMPI_URI in environ and (_as_int("OMPI_COMM_WORLD_SIZE", environ.get("OMPI_COMM_WORLD_SIZE")) or 1) > 1


def resolve(coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, *, environ: Mapping[str, str] | None = None,
            detect_cluster: bool = True) -> Topology:
  """Decides how to join the job, without touching JAX: flags, else RLAX_* env, else a detected cluster
  (with `detect_cluster`). Any flag given makes the flags the whole setting (the env is then ignored).

  Raises:
    ValueError: for an incomplete or inconsistent setting (a count or index missing or not an int, process_id
      outside [0, num_processes), a multi-process job without a HOST:PORT coordinator address).
  """
  environ = os.environ if environ is None else environ
  flags = (coordinator_address or None, _as_int("--num_processes", num_processes),
           _as_int("--process_id", process_id))
  env = (environ.get(ENV_COORDINATOR) or None, _as_int(ENV_NUM_PROCESSES, environ.get(ENV_NUM_PROCESSES)),
         _as_int(ENV_PROCESS_ID, environ.get(ENV_PROCESS_ID)))
  if any(v is not None for v in flags):
    source, (address, count, index) = "flags", flags
    names = ("--coordinator_address", "--num_processes", "--process_id")
  elif any(v is not None for v in env):
    source, (address, count, index) = "env", env
    names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
  elif detect_cluster and _cluster_detected(environ):
    return Topology(source="cluster")
  else:
    return Topology(source="single")
  if count is None:
    raise ValueError(f"{names[1]} is required with {names[0]} / {names[2]} (the number of processes).")
  if count < 1:
    raise ValueError(f"{names[1]} must be >= 1; got {count}.")
  index = 0 if index is None and count == 1 else index
  if index is None:
    raise ValueError(f"{names[2]} is required for a job of {count} processes (0 .. {count - 1}, one per "
                     "process).")
  if not 0 <= index < count:
    raise ValueError(f"{names[2]} must be in [0, {count}) for {names[1]}={count}; got {index}.")
  if count == 1:
    return Topology(source="single")
  host, _, port = (address or "").rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:  # (else process 0 waits for peers in vain)
    raise ValueError(f"{names[0]} must be HOST:PORT of process 0 (the coordinator; PORT in 1 .. 65535) for a "
                     f"job of {count} processes; got {address!r}.")
  return Topology(source=source, coordinator_address=address, num_processes=count, process_id=index)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, detect_cluster: bool = True) -> Topology:
  """Joins the multi-process job described by the flags, the RLAX_* env or the cluster (see `resolve`).

  `detect_cluster=False` joins only on explicit flags or RLAX_* variables (for commands that are usually
  single-process, e.g. the units of a sweep launched inside a SLURM allocation).

  Must run before anything touches a JAX backend. On the CPU, cross-process collectives go through gloo
  (selected here; the number of devices per process comes from XLA_FLAGS'
  --xla_force_host_platform_device_count). A single process (no flags, env or cluster) is left alone. If a
  process dies, JAX's coordination service stops the others after its heartbeat timeout.
  """
  topology = resolve(coordinator_address, num_processes, process_id, detect_cluster=detect_cluster)
  if topology.source == "single" or jax.distributed.is_initialized():
    return topology
  # CPU devices of different processes talk through gloo (jax 0.10's default; older releases had none). Only
  # the CPU backend reads it; an explicit MPI choice is kept.
  if jax.config.jax_cpu_collectives_implementation != "mpi":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if topology.source == "cluster":
    try:
      jax.distributed.initialize()
    except ValueError as e:  # (JAX's 'coordinator_address should be defined.': it found no cluster it knows)
      raise ValueError(f"this process looks like one of a multi-process job ({ENV_AUTO}, or a TPU pod's "
                       f"variables), but jax.distributed could not set it up ({e}); pass --coordinator_address, "
                       "--num_processes and --process_id (or the RLAX_* variables), or --num_processes=1 for "
                       "one process.") from None
    return topology
  flag = "--coordinator_address" if topology.source == "flags" else ENV_COORDINATOR
  if topology.process_id == 0:
    _check_port_free(flag, topology.coordinator_address)
  try:
    jax.distributed.initialize(topology.coordinator_address, num_processes=topology.num_processes,
                               process_id=topology.process_id)
  except jax.errors.JaxRuntimeError as e:
    raise ValueError(f"{flag}={topology.coordinator_address}: process {topology.process_id} of "
                     f"{topology.num_processes} could not join the job ({e}).") from None
  return topology


def _check_port_free(flag: str, address: str) -> None:
  """Raises a clear error if the coordinator's port is taken on this machine, where process 0 serves it (JAX's
  service binds every interface, and on a taken port it raised JaxRuntimeError or crashed the process)."""
  port = int(address.rpartition(":")[2])
  try:
    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as gRPC: a closed port's TIME_WAIT is free)
      probe.bind(("::" if socket.has_ipv6 else "", port))
  except OSError as e:
    if e.errno in (errno.EADDRINUSE, errno.EACCES):  # (others, e.g. no IPv6 here: JAX's own try decides)
      raise ValueError(f"{flag}={address}: port {port} cannot be served on this machine, where process 0 "
                       f"runs the job's coordinator ({e.strerror}); pick a free port.") from None


def is_primary() -> bool:
  """Process 0: the one that reads the rollout queue, grants tickets and writes metrics and summaries."""
  return jax.process_index() == 0


def is_multiprocess() -> bool:
  return jax.process_count() > 1


def check_single_process(what: str) -> None:
  """Raises a clear error for a role that runs in one process only."""
  if is_multiprocess():
    raise ValueError(f"{what} runs in a single process; this is process {jax.process_index()} of "
                     f"{jax.process_count()}. Run the multi-host learner as `rlax-post learner` (with "
                     "`rlax-post sampler` processes), or `rlax-post replay` (docs/launch.md, section 4).")


# --- Batches ----------------------------------------------------------------------------------------------


def row_shard(sharding: jax.sharding.Sharding, rows: int) -> tuple[int, int]:
  """(index, count): this process's devices hold block `index` of `count` equal blocks of a batch's rows.

  A process loads only that block (e.g. grain batches of rows // count, every count-th one from index). A
  batch whose rows are not split across processes (or a single process) gives (0, 1).
  """
  spans = sorted({s[0].indices(rows)[:2] for s in sharding.addressable_devices_indices_map((rows,)).values()})
  start, stop = spans[0][0], spans[-1][1]
  for (_, end), (begin, _) in zip(spans, spans[1:]):
    if begin != end:
      raise ValueError(f"This process's devices hold rows {spans} of the batch, not one contiguous block; "
                       "order the mesh's devices by process.")
  size = stop - start
  if rows % size or start % size:
    raise ValueError(f"This process's rows [{start}, {stop}) are not one of {rows} // {size} equal blocks.")
  return start // size, rows // size


def _canonical(value) -> np.ndarray:
  value = np.asarray(value)
  return value.astype(jax.dtypes.canonicalize_dtype(value.dtype), copy=False)


def to_global(value, sharding: jax.sharding.Sharding, rows: int | None = None) -> jax.Array:
  """An array on `sharding` from host data on every process.

  `value` is the whole array (every process passes the same; each copies only its own shards), or, with
  `rows` = the global row count larger than `len(value)`, this process's block of rows (`row_shard`).
  """
  value = _canonical(value)
  if not is_multiprocess():
    return jax.device_put(jnp.asarray(value), sharding)
  if rows is None or rows == len(value):
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
  return jax.make_array_from_process_local_data(sharding, value, (rows, *value.shape[1:]))


def to_host(tree: Any) -> Any:
  """numpy copies of a pytree of arrays on every process (an all-gather where a process lacks shards)."""
  if not is_multiprocess():
    return jax.device_get(tree)

  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return np.asarray(x)
    if x.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.tree.map(one, tree)


# --- Process 0's data to every process --------------------------------------------------------------------


def broadcast_bytes(payload: bytes | None) -> bytes:
  """Process 0's `payload` on every process (others pass None). A collective: every process must call it."""
  if not is_multiprocess():
    return payload
  size = np.asarray([len(payload) if is_primary() else 0], np.int64)
  size = int(multihost_utils.broadcast_one_to_all(size)[0])
  buf = np.frombuffer(payload, np.uint8) if is_primary() else np.zeros(size, np.uint8)
  return np.asarray(multihost_utils.broadcast_one_to_all(buf)).tobytes()


def broadcast_float(value: float | None) -> float:
  """Process 0's `value` on every process (a collective; others pass anything)."""
  if not is_multiprocess():
    return float(value)
  out = multihost_utils.broadcast_one_to_all(np.asarray([value if is_primary() else 0.0], np.float64))
  return float(np.asarray(out)[0])


def gather_flags(flag: bool) -> list[bool]:
  """Every process's `flag`, in process order, on every process (a collective: every process must call it)."""
  if not is_multiprocess():
    return [bool(flag)]
  flags = multihost_utils.process_allgather(np.asarray([int(bool(flag))], np.int32))
  return [bool(x) for x in np.asarray(flags).reshape(-1)]


def barrier(name: str) -> None:
  """Waits until every process reaches `name`."""
  if is_multiprocess():
    multihost_utils.sync_global_devices(name)


class PrimaryEval:
  """The learner's greedy eval on a multi-host learner: gathered to host, run by process 0, broadcast.

  Decoding is a host-driven loop of small programs; running it as one multi-process program would make every
  step a cross-host collective. Instead every process takes part in gathering the params to host memory (a
  collective), process 0 decodes on its own devices (`local_eval`, built on a mesh of `jax.local_devices()`
  with `local_shardings`), and its scores are broadcast, so all processes return the same summary. The others
  wait meanwhile; the params must fit in process 0's host memory.
  """

  def __init__(self, local_eval: Any, local_shardings: Any):
    self.local_eval, self.local_shardings = local_eval, local_shardings

  def evaluate(self, params, samples: int = 0) -> tuple[dict[str, float], list[dict], str | None]:
    """(scores, records of the first `samples` examples, the first failed reward call's error): the local
    evaluator's `evaluate`, broadcast."""
    host_params = to_host(params)
    payload = None
    if is_primary():
      evaluation = self.local_eval.evaluate(jax.device_put(host_params, self.local_shardings), samples)
      payload = json.dumps(list(evaluation)).encode()
    scores, records, failure = json.loads(broadcast_bytes(payload))
    return scores, records, failure
