"""The jobs of one work unit, independent of where they run.

A work unit with N samplers is an async run: one `rlax-post learner` job (H hosts) and N `rlax-post sampler`
jobs, all sharing the unit's workdir (the learner writes config.json there; the samplers read it). With N = 0
it is one single-host `rlax-post train` job (the sync loop samples inside its one process).

A multi-host job is the same command on every host; how the hosts find each other is `Job.multihost`:
  "coordinator": process 0's address, the process count and each process's id are handed to it (the CLI's
                 --coordinator_address/--num_processes/--process_id flags, or the RLAX_* variables);
  "auto":        JAX finds the slice itself (Cloud TPU: `jax.distributed.initialize()` needs no arguments);
  "":            a single host.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses

from launch import accelerators
from rlax_post import runtime

COORDINATOR_PORT = 8476
# The variables rlax_post.runtime reads when the flags are absent.
ENV_COORDINATOR = runtime.ENV_COORDINATOR
ENV_NUM_PROCESSES = runtime.ENV_NUM_PROCESSES
ENV_PROCESS_ID = runtime.ENV_PROCESS_ID
ENV_AUTO = runtime.ENV_AUTO


@dataclasses.dataclass(frozen=True)
class Job:
  """One role of a work unit.

  Attributes:
    role: "train", "learner" or "sampler".
    name: unique within the unit: "train", "learner", "sampler-0", ...
    args: the `rlax-post` arguments (the subcommand first).
    hosts: processes (hosts) that run this command together.
    accelerator: what each host (GPU, CPU) or the whole slice (TPU) has.
    multihost: "coordinator", "auto" or "" (module docstring).
    env: environment variables every host gets.
  """
  role: str
  name: str
  args: tuple[str, ...]
  hosts: int
  accelerator: accelerators.Accelerator
  multihost: str = ""
  env: tuple[tuple[str, str], ...] = ()

  def to_dict(self) -> dict:
    return {"role": self.role, "name": self.name, "args": list(self.args), "hosts": self.hosts,
            "accelerator": self.accelerator.spec, "multihost": self.multihost, "env": dict(self.env)}


def learner_hosts(accelerator: accelerators.Accelerator, requested: int | None) -> int:
  """The learner's host count: a TPU slice's own host count, else `requested` (default 1)."""
  if accelerator.platform == "tpu":
    hosts = accelerator.tpu_hosts
    if requested not in (None, hosts):
      raise ValueError(f"--learner_hosts={requested} does not match the TPU slice {accelerator.spec} "
                       f"({hosts} hosts of {accelerator.chips_per_host} chips); leave it unset.")
    return hosts
  hosts = 1 if requested is None else requested
  if hosts < 1:
    raise ValueError(f"--learner_hosts must be >= 1; got {hosts}.")
  return hosts


def _multihost(accelerator: accelerators.Accelerator, hosts: int) -> tuple[str, tuple[tuple[str, str], ...]]:
  if hosts == 1:
    return "", ()
  if accelerator.platform == "tpu":
    return "auto", ((ENV_AUTO, "1"),)
  return "coordinator", ((ENV_NUM_PROCESSES, str(hosts)),)


def unit_jobs(config: str, unit_flags: Sequence[str], extra_flags: Sequence[str], workdir: str, *,
              num_samplers: int, hosts: int, accelerator: accelerators.Accelerator,
              sampler_accelerator: accelerators.Accelerator | None = None,
              quiet: bool = True) -> list[Job]:
  """The jobs of one work unit: [train] when num_samplers == 0, else [learner, sampler-0, ...].

  Args:
    config: the `--config` spec ("configs/demo.py:tiny").
    unit_flags: the unit's `--config.key=value` overrides (`sweep.WorkUnit.flags()`).
    extra_flags: overrides from the launcher's command line, for every unit (they come before the unit's own,
      so a swept key always takes the sweep's value).
    workdir: the unit's workdir as the jobs see it.
    num_samplers: sampler jobs (0: one sync `train` job).
    hosts: learner (or train) hosts.
    accelerator: the learner's accelerator.
    sampler_accelerator: each sampler's (default: one host of the learner's).
    quiet: pass --quiet (no progress bars in job logs).
  """
  if num_samplers < 0:
    raise ValueError(f"--num_samplers must be >= 0; got {num_samplers}.")
  tail = (["--quiet"] if quiet else []) + ["--workdir", workdir]
  multihost, env = _multihost(accelerator, hosts)
  overrides = [*extra_flags, *unit_flags]
  if num_samplers == 0:
    if hosts > 1:  # The sync loop samples inside the learner, which runs on one process (docs/launch.md §4).
      raise ValueError(f"a {hosts}-host learner runs as `rlax-post learner` with sampler jobs: set "
                       "--num_samplers >= 1 (--num_samplers=0 is one single-host `rlax-post train` job).")
    args = ["train", "--config", config, *overrides, "--auto_resume", *tail]
    return [Job("train", "train", tuple(args), hosts, accelerator, multihost, env)]
  args = ["learner", "--config", config, "--config.runtime.mode=async",
          f"--config.runtime.num_samplers={num_samplers}", *overrides, "--auto_resume", *tail]
  jobs = [Job("learner", "learner", tuple(args), hosts, accelerator, multihost, env)]
  sampler_acc = sampler_accelerator or accelerator.single_host()
  for k in range(num_samplers):
    args = ["sampler", "--index", str(k), *tail]
    jobs.append(Job("sampler", f"sampler-{k}", tuple(args), 1, sampler_acc))
  return jobs


def container_path(workdir: str) -> str:
  """Where a gs:// workdir appears inside the containers: Cloud Storage FUSE at /gcs/BUCKET/PATH (mounted by
  Vertex AI on every job; by the GKE manifests' gcsfuse volume). Other paths are used as they are."""
  if workdir.startswith("gs://"):
    return "/gcs/" + workdir[len("gs://"):]
  return workdir


def bucket(workdir: str) -> str | None:
  return workdir[len("gs://"):].split("/", 1)[0] if workdir.startswith("gs://") else None
