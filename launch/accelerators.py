"""Accelerators for `launch_xm.py`: parsing `--accelerator`, and what Vertex AI and GKE call each one.

  tpu-v5p:2x2x4   a TPU slice: generation and topology (16 chips, 4 hosts of 4 chips)
  tpu-v5e:2x4     a single-host v5e slice (8 chips)
  h100x8          GPUs per host: type and count
  cpu             no accelerator

The tables hold the names each service expects (Vertex machine types and accelerator enums, GKE node labels
and resource names); the rest of the launcher only deals with `Accelerator`.
"""

from __future__ import annotations

import dataclasses
import math
import re

# TPU generation -> (Vertex machine type pattern ({n}: chips per host), GKE accelerator label, the most chips
# one host of a multi-host slice has, the topology of one host (a sampler's single-host slice)).
_TPUS = {
    "v4": ("ct4p-hightpu-4t", "tpu-v4-podslice", 4, "2x2x1"),
    "v5e": ("ct5lp-hightpu-{n}t", "tpu-v5-lite-podslice", 4, "2x2"),
    "v5p": ("ct5p-hightpu-4t", "tpu-v5p-slice", 4, "2x2x1"),
    "v6e": ("ct6e-standard-{n}t", "tpu-v6e-slice", 4, "2x2"),
}
# Single-host slices of v5e/v6e may have 8 chips on one machine (2x4); multi-host slices have 4 per host.
_SINGLE_HOST_MAX_CHIPS = {"v4": 4, "v5e": 8, "v5p": 4, "v6e": 8}
# The slice shapes of the 2D generations (GKE's and Vertex AI's: no machine type or node pool has another; a
# v4 / v5p slice is whole hosts of 4 chips, 2x2x1 the smallest).
_TOPOLOGIES_2D = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")

# GPU type -> (Vertex accelerator enum, Vertex machine type per GPU count, GKE accelerator label, xm resource).
_GPUS = {
    "h100": ("NVIDIA_H100_80GB", {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g",
                                  8: "a3-highgpu-8g"}, "nvidia-h100-80gb", "h100"),
    "h200": ("NVIDIA_H200_141GB", {8: "a3-ultragpu-8g"}, "nvidia-h200-141gb", "h200"),
    "a100": ("NVIDIA_TESLA_A100", {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g",
                                   8: "a2-highgpu-8g", 16: "a2-megagpu-16g"}, "nvidia-tesla-a100", "a100"),
    "a100-80gb": ("NVIDIA_A100_80GB", {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g", 4: "a2-ultragpu-4g",
                                       8: "a2-ultragpu-8g"}, "nvidia-a100-80gb", "a100_80gib"),
    "l4": ("NVIDIA_L4", {1: "g2-standard-8", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"},
           "nvidia-l4", "l4_24th"),
}
# Vertex has no enum for v5p/v6e: the machine type and topology name the slice (accelerator_type is left unset).
_CPU_MACHINE_TYPE = "n2-standard-8"


@dataclasses.dataclass(frozen=True)
class Accelerator:
  """One host's (GPU, CPU) or one slice's (TPU) accelerator.

  Attributes:
    platform: "cpu", "gpu" or "tpu".
    kind: the GPU type ("h100") or TPU generation ("v5p"); "" on the CPU.
    count: GPUs per host, or TPU chips in the whole slice; 0 on the CPU.
    topology: TPU slice topology ("2x2x4"); "" otherwise.
  """
  platform: str
  kind: str = ""
  count: int = 0
  topology: str = ""

  @property
  def spec(self) -> str:
    """The `--accelerator` string this parses from."""
    if self.platform == "tpu":
      return f"tpu-{self.kind}:{self.topology}"
    return f"{self.kind}x{self.count}" if self.platform == "gpu" else "cpu"

  @property
  def tpu_hosts(self) -> int:
    """Hosts (VMs) of a TPU slice: one for small slices, else chips / chips-per-host."""
    if self.platform != "tpu":
      return 1
    if self.count <= _SINGLE_HOST_MAX_CHIPS[self.kind]:
      return 1
    return self.count // _TPUS[self.kind][2]

  @property
  def chips_per_host(self) -> int:
    return self.count // self.tpu_hosts if self.platform == "tpu" else self.count

  def single_host(self) -> Accelerator:
    """The accelerator of one host of this slice (what a sampler gets by default)."""
    if self.platform != "tpu" or self.tpu_hosts == 1:
      return self
    return parse("tpu", f"tpu-{self.kind}:{_TPUS[self.kind][3]}")

  # -- Vertex AI (aiplatform_v1.MachineSpec fields) --

  def vertex_machine_spec(self) -> dict:
    """`MachineSpec` fields: machine_type, accelerator_type/count (GPUs), tpu_topology (TPUs)."""
    if self.platform == "cpu":
      return {"machine_type": _CPU_MACHINE_TYPE}
    if self.platform == "gpu":
      enum, machines, _, _ = _GPUS[self.kind]
      if self.count not in machines:
        raise ValueError(f"Vertex AI has no machine with {self.count} {self.kind} GPUs; valid counts: "
                         f"{sorted(machines)}.")
      return {"machine_type": machines[self.count], "accelerator_type": enum, "accelerator_count": self.count}
    pattern = _TPUS[self.kind][0]
    return {"machine_type": pattern.format(n=self.chips_per_host), "tpu_topology": self.topology}

  # -- GKE (node selectors and container resource limits) --

  def gke_node_selector(self) -> dict[str, str]:
    if self.platform == "gpu":
      return {"cloud.google.com/gke-accelerator": _GPUS[self.kind][2]}
    if self.platform == "tpu":
      return {"cloud.google.com/gke-tpu-accelerator": _TPUS[self.kind][1],
              "cloud.google.com/gke-tpu-topology": self.topology}
    return {}

  def gke_limits(self) -> dict[str, str]:
    if self.platform == "gpu":
      return {"nvidia.com/gpu": str(self.count)}
    if self.platform == "tpu":
      return {"google.com/tpu": str(self.chips_per_host)}
    return {}

  # -- XManager --

  def xm_requirements(self) -> dict:
    """Keyword arguments of `xm.JobRequirements` (e.g. {"tpu_v5p": "2x2x4"}, {"h100": 8})."""
    if self.platform == "gpu":
      return {_GPUS[self.kind][3]: self.count}
    if self.platform == "tpu":
      return {f"tpu_{self.kind}": self.topology}
    return {}


def parse(platform: str, spec: str | None) -> Accelerator:
  """`--platform` and `--accelerator` -> Accelerator; raises ValueError with the valid forms."""
  if platform == "cpu":
    if spec not in (None, "", "cpu"):
      raise ValueError(f"--platform=cpu takes no --accelerator; got {spec!r}.")
    return Accelerator("cpu")
  if not spec:
    raise ValueError(f"--platform={platform} needs --accelerator (e.g. tpu-v5p:2x2x4 or h100x8).")
  if platform == "tpu":
    m = re.fullmatch(r"tpu-(v\w+):(\d+(?:x\d+)+)", spec)
    if not m or m.group(1) not in _TPUS:
      raise ValueError(f"TPU accelerator {spec!r}: expected tpu-GEN:TOPOLOGY with GEN in {sorted(_TPUS)}, "
                       "e.g. tpu-v5p:2x2x4 or tpu-v5e:4x4.")
    kind, topology = m.groups()
    dims = [int(d) for d in topology.split("x")]
    if len(dims) != (3 if kind in ("v4", "v5p") else 2):
      raise ValueError(f"TPU {kind} topologies have {3 if kind in ('v4', 'v5p') else 2} dimensions; "
                       f"got {topology!r}.")
    if len(dims) == 2 and topology not in _TOPOLOGIES_2D:
      raise ValueError(f"TPU {kind} slices are {', '.join(_TOPOLOGIES_2D)}; got {topology!r}.")
    acc = Accelerator("tpu", kind, math.prod(dims), topology)
    if acc.count % _TPUS[kind][2] and (acc.tpu_hosts > 1 or len(dims) == 3):
      raise ValueError(f"TPU slice {spec!r}: {acc.count} chips do not fill hosts of {_TPUS[kind][2]}.")
    return acc
  if platform == "gpu":
    m = re.fullmatch(r"([a-z0-9-]+?)x(\d+)", spec)
    if not m or m.group(1) not in _GPUS:
      raise ValueError(f"GPU accelerator {spec!r}: expected TYPExCOUNT with TYPE in {sorted(_GPUS)}, "
                       "e.g. h100x8.")
    return Accelerator("gpu", m.group(1), int(m.group(2)))
  raise ValueError(f"--platform must be cpu, gpu or tpu; got {platform!r}.")
