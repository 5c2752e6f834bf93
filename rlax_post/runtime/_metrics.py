"""Run outputs: metrics.jsonl, a PNG of the curves, summary.json, and the mirrors of the logged rows: TensorBoard
event files and a Weights & Biases run (`runtime.wandb`), each a `Sink`."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import shutil
import sys
from typing import Any, Iterable, Mapping, Protocol

import numpy as np
import tqdm

from rlax_post import envs

EVAL_COMPONENT_PREFIX = "eval_" + envs.REWARD_PREFIX  # eval_reward/<name>: a component's held-out mean


@dataclasses.dataclass(frozen=True)
class Console:
  """Status lines and progress bars, or neither (`quiet`; bars also off with `progress=False`)."""
  quiet: bool = False
  progress: bool = True

  def say(self, *args) -> None:
    if not self.quiet:
      print(*args, flush=True)

  def warn(self, message: str) -> None:
    """A warning a person must see (what was skipped or set aside): to stderr, even when quiet."""
    print(f"warning: {message}", file=sys.stderr, flush=True)

  def bar(self, it: Iterable, **kwargs):
    """`tqdm(it, **kwargs)`, or `it` itself when bars are off."""
    if self.quiet or not self.progress:
      return it
    return tqdm.tqdm(it, dynamic_ncols=True, **kwargs)


def read_jsonl(path: str) -> list[dict]:
  """The rows of a JSON-lines file ([] if it does not exist).

  A last line cut short by a crash in the middle of an append (no final newline) is dropped with a warning:
  it is the one row that was being written. Any other line that does not parse is a ValueError naming the
  file and the line.
  """
  if not os.path.exists(path):
    return []
  with open(path) as f:
    text = f.read()
  lines = text.split("\n")
  rows = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError as e:
      if number == len(lines):  # The last line, with no newline after it: a torn append.
        print(f"warning: {path}, line {number}: dropped a row cut short by an interrupted write.",
              file=sys.stderr, flush=True)
        continue
      raise ValueError(f"{path}, line {number}: not a JSON row ({e.msg} at column {e.colno}); the file is "
                       "corrupt: repair or remove that line.") from None
  return rows


def truncate_jsonl(path: str, keep) -> None:
  """Drops the rows of a JSON-lines file that `keep(row)` rejects (written aside, then renamed over it: never a
  half-written file)."""
  if not os.path.exists(path):
    return
  rows = [r for r in read_jsonl(path) if keep(r)]
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  os.replace(tmp, path)


def write_jsonl(path: str, rows: Iterable[Mapping[str, Any]]) -> None:
  """`rows` as a JSON-lines file at `path` (strict JSON; written aside, then renamed over it: never half a
  file)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(map(_strict_line, rows))
  os.replace(tmp, path)


def _strict_line(row: Mapping[str, Any]) -> str:
  """`row` as one line of strict JSON (its NaN and inf as null: `strict_json`)."""
  return json.dumps(strict_json(row), allow_nan=False) + "\n"


def finite_or_none(v):
  v = float(v)
  return v if math.isfinite(v) else None


def short_float(x) -> float:
  """`x` (a number, numpy scalar or 0-d array) as a Python float; a float32 or float16 one (rows store rewards in
  float32) as the shortest decimal that reads back as the same float32: a reward of 0.7 writes as 0.7 in JSON,
  where its float64 value wrote 0.699999988079071 until 2026-12-06. NaN and inf stay as they are."""
  value = np.asarray(x)
  if value.dtype in (np.float32, np.float16):
    return float(str(value[()]))  # (numpy's text of a float32 scalar is its shortest round trip)
  return float(x)


def logged_at(step: int, every: int, last: int) -> bool:
  """Whether a phase of `last` steps that logs every `every` steps (`runtime.log_every`) logs its step `step`
  (1-based): every `every`-th step, and its last one whatever `every` is (RL, and the SFT warm-up)."""
  return step % every == 0 or step == last


def strict_json(x: Any):
  """`x` with its numpy scalars as Python numbers, tuples as lists and its undefined figures (NaN, inf: a
  metric with nothing to average, a diverged run's reward) as None, so that it writes as strict JSON."""
  if isinstance(x, Mapping):
    return {k: strict_json(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [strict_json(v) for v in x]
  if isinstance(x, (np.integer, np.floating)):
    x = x.item()
  return finite_or_none(x) if isinstance(x, float) else x


class Sink(Protocol):
  """A mirror of the logged rows (TensorBoard, W&B): fed each row and each evaluation's records as they are
  written, and the kept history after a resume cut the rows past the restored checkpoint."""

  def scalars(self, row: Mapping[str, Any]) -> None:
    """One row of metrics.jsonl ({"phase", "step", name: value or None})."""

  def samples(self, step: int, records: list[dict]) -> None:
    """An evaluation's records (`stamped`), as eval_samples.jsonl holds them."""

  def rebuild(self, rows: list[dict], samples: list[dict]) -> None:
    """After a resume: the rows and records kept (the ones logged past the checkpoint are gone from both)."""

  def close(self, failed: bool = False) -> None:
    """Ends the mirror; `failed`: the run raised (a W&B run is marked failed, not finished)."""


def _scalars(row: Mapping[str, Any]) -> dict[str, float]:
  """A row's values as the mirrors name them, `phase/name`, its unknown (None) ones left out."""
  return {f"{row['phase']}/{k}": v for k, v in row.items() if k not in ("phase", "step") and v is not None}


class TensorBoardSink:
  """TensorBoard event files under `directory`: scalars `phase/name` at the row's step, an evaluation's records
  as one text summary (tag `eval/samples`). Event files are append-only, so a resume rewrites them from the
  kept history (the rows of a killed learner's last steps would otherwise show twice)."""

  def __init__(self, directory: str):
    self.directory = directory
    self._writer = self._open()

  def _open(self):
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top  (optional output; heavy import)
    return SummaryWriter(self.directory)

  def scalars(self, row: Mapping[str, Any]) -> None:
    for tag, v in _scalars(row).items():
      self._writer.add_scalar(tag, v, int(row["step"]))

  def samples(self, step: int, records: list[dict]) -> None:
    self._writer.add_text("eval/samples", samples_markdown(records), int(step))

  def rebuild(self, rows: list[dict], samples: list[dict]) -> None:
    self._writer.close()
    shutil.rmtree(self.directory, ignore_errors=True)  # Derived from metrics.jsonl, which is kept.
    self._writer = self._open()
    for row in rows:
      self.scalars(row)
    by_step: dict[int, list[dict]] = {}
    for record in samples:
      by_step.setdefault(int(record["step"]), []).append(record)
    for step, records in by_step.items():
      self.samples(step, records)

  def close(self, failed: bool = False) -> None:
    del failed  # (event files have no end state)
    self._writer.close()


WANDB_FILE = "wandb_run.json"  # the W&B run's id, so that a resumed run continues the same W&B run
WANDB_MISSING = ("runtime.wandb = True needs the wandb package, which is not installed: pip install "
                 "'rlax-post[wandb]' (in a clone: pip install -e '.[wandb]'), or set runtime.wandb = False.")
_SAMPLE_COLUMNS = ("step", "example", "reward", "finished", "prompt", "completion")


def check_wandb(wanted: bool) -> None:
  """A ValueError (`WANDB_MISSING`, one line) when `wanted` (`runtime.wandb`) but wandb is not installed:
  asked before any work (the sink imports it only when the run logs its first row)."""
  if wanted and importlib.util.find_spec("wandb") is None:
    raise ValueError(WANDB_MISSING)


def _import_wandb():
  """wandb, imported when a run logs its first row (an optional extra); `WANDB_MISSING` without it."""
  try:
    import wandb  # pylint: disable=g-import-not-at-top  (optional extra; heavy import)
  except ImportError:
    raise ValueError(WANDB_MISSING) from None
  return wandb


@dataclasses.dataclass(frozen=True)
class WandbRun:
  """The Weights & Biases run a learner logs to (`runtime.wandb`): None means wandb's own choice (its
  environment variables: WANDB_ENTITY, WANDB_MODE, else the account's entity and online)."""
  project: str
  name: str
  entity: str | None = None
  group: str | None = None  # the runs W&B shows together (a sweep's units); None: WANDB_RUN_GROUP, else none
  mode: str | None = None  # "online", "offline", "disabled"
  config: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the run's config, shown by W&B


class WandbSink:
  """A Weights & Biases run mirroring the rows: each phase's values `phase/name` on its own step axis
  (`phase/step`, by `define_metric`: the SFT warm-start's steps and the RL steps do not share one, and wandb's
  own step only counts calls, so it never goes back), an evaluation's records as a `wandb.Table`
  (`eval/samples`). The run opens at the first row (a run refused before it logs anything leaves no W&B run),
  in `workdir/wandb/` (WANDB_DIR moves it), and its id is kept in `workdir/wandb_run.json`: a resumed run
  continues the same W&B run (`resume="allow"`). W&B's history is append-only: the steps trained again after
  a resume are logged again, beside the ones the killed attempt logged (`rebuild` does nothing)."""

  def __init__(self, workdir: str, spec: WandbRun):
    self.workdir, self.spec = workdir, spec
    self._wandb = self._run = None

  def _open(self):
    if self._run is None:
      self._wandb = wandb = _import_wandb()
      try:
        self._run = wandb.init(**self._init_args())
      except wandb.Error as e:  # (no API key without a terminal, an entity the key cannot write to, ...)
        raise ValueError(f"runtime.wandb: wandb.init failed: {e} (to log in: `wandb login` or WANDB_API_KEY; or set "
                         "runtime.wandb_mode = 'offline' and `wandb sync` the run later).") from None
      write_json(os.path.join(self.workdir, WANDB_FILE), {"id": self._run.id})
      for phase in ("sft", "rl", "eval"):
        self._run.define_metric(f"{phase}/step")
        self._run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
    return self._run

  def _init_args(self) -> dict:
    """`wandb.init`'s arguments: the spec's, the kept id of a resumed run, and `reinit="create_new"`: a run of
    its own whatever other W&B run the process has open (wandb's default hands back an unfinished one: a
    caller's own, or that of an earlier `train` in the process that raised, whose id and rows this run's would
    then be, and which `close` would finish)."""
    spec, path = self.spec, os.path.join(self.workdir, WANDB_FILE)
    kept = {}
    if os.path.exists(path):
      with open(path) as f:
        kept = {"id": json.load(f)["id"], "resume": "allow"}
    where = {} if os.environ.get("WANDB_DIR") else {"dir": self.workdir}
    return dict(project=spec.project, entity=spec.entity, name=spec.name, group=spec.group, mode=spec.mode,
                config=dict(spec.config), reinit="create_new", **where, **kept)

  def scalars(self, row: Mapping[str, Any]) -> None:
    self._open().log({f"{row['phase']}/step": int(row["step"]), **_scalars(row)})

  def samples(self, step: int, records: list[dict]) -> None:
    run = self._open()
    table = self._wandb.Table(columns=list(_SAMPLE_COLUMNS),
                              data=[[r.get(c) for c in _SAMPLE_COLUMNS] for r in records])
    run.log({"eval/step": int(step), "eval/samples": table})

  def rebuild(self, rows: list[dict], samples: list[dict]) -> None:
    del rows, samples  # W&B's history is append-only (the class docstring).

  def close(self, failed: bool = False) -> None:
    if self._run is not None:
      self._run.finish(exit_code=1 if failed else None)
      self._run = None


class MetricsWriter:
  """Appends one JSON line per logged step to metrics.jsonl and mirrors it to its sinks (`TensorBoardSink`
  with `tensorboard`, `WandbSink` with a `wandb` run); `write_samples` appends an evaluation's records of what
  the policy wrote (`_eval.eval_record`) to eval_samples.jsonl, one line each, and shows them in the sinks.

  On resume, `truncate_after(step)` drops lines logged after the restored checkpoint, so the file describes
  exactly one history, and `rebuild_tensorboard()` hands the kept history to the sinks (TensorBoard rewrites
  its event files from it). An inactive writer (`active=False`: processes other than 0 of a multi-host
  learner) writes nothing, opens no sink and only reads.
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True, wandb: WandbRun | None = None,
               active: bool = True):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tb_dir = os.path.join(workdir, "tensorboard")
    self.samples_path = os.path.join(workdir, SAMPLES_FILE)
    self.active = active
    self._sinks: list[Sink] = []
    if active and tensorboard:
      self._sinks.append(TensorBoardSink(self.tb_dir))
    if active and wandb is not None:
      self._sinks.append(WandbSink(workdir, wandb))

  def rebuild_tensorboard(self) -> bool:
    """Hands the rows of metrics.jsonl and eval_samples.jsonl (after `truncate_after`) to the sinks. Without a
    TensorBoard sink (`runtime.tensorboard` off at a resume), removes the event files an earlier attempt wrote:
    they would stop at that attempt's last step, with the steps after the checkpoint this run redoes (which
    metrics.jsonl dropped). Returns whether it removed them (a resume with TensorBoard on writes them again
    from metrics.jsonl, which keeps every row)."""
    if self._sinks:
      rows, samples = self.read(), read_jsonl(self.samples_path)
      for sink in self._sinks:
        sink.rebuild(rows, samples)
    if not self.active or any(isinstance(sink, TensorBoardSink) for sink in self._sinks):
      return False
    if not os.path.isdir(self.tb_dir):
      return False
    shutil.rmtree(self.tb_dir)
    return True

  def truncate_after(self, step: int, phase: str = "rl") -> None:
    if not self.active:
      return
    truncate_jsonl(self.path, lambda r: not (r.get("phase") == phase and r["step"] > step))
    if phase == "eval":  # The records of the evaluations dropped with their rows.
      truncate_jsonl(self.samples_path, lambda r: r["step"] <= step)

  def write(self, step: int, metrics: Mapping[str, Any], *, phase: str = "rl") -> None:
    if not self.active:
      return
    row = {"phase": phase, "step": int(step)}
    row.update({k: finite_or_none(v) for k, v in metrics.items()})
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    for sink in self._sinks:
      sink.scalars(row)

  def write_samples(self, step: int, records: list[dict]) -> None:
    """Appends `records` (an evaluation's `_eval.eval_record`s, each stamped with `step` first) to
    eval_samples.jsonl and shows them in the sinks; nothing for no records."""
    if not self.active or not records:
      return
    lines = stamped(step, records)
    with open(self.samples_path, "a") as f:
      f.writelines(map(_strict_line, lines))
    for sink in self._sinks:
      sink.samples(int(step), lines)

  def read(self) -> list[dict]:
    return read_jsonl(self.path)

  def close(self, failed: bool = False) -> None:
    """Closes the sinks; `failed`: the run raised (`Sink.close`). A run that raised closes them too, so a process
    that goes on (a notebook, a caller's next `train`) holds no open W&B run or event file of it."""
    for sink in self._sinks:
      sink.close(failed)


SAMPLES_FILE = "eval_samples.jsonl"  # the records of each evaluation's first `eval.samples` examples
# schedule: async runs
OUTPUT_FILES = ("metrics.jsonl", "summary.json", "curves.png", "schedule.jsonl", SAMPLES_FILE, WANDB_FILE)


def stamped(step: int, records: list[dict]) -> list[dict]:
  """`records` with the RL step of the policy that wrote them first: the lines of eval_samples.jsonl and of
  `rlax-post evaluate`'s output."""
  return [{"step": int(step), **r} for r in records]


def samples_markdown(records: list[dict]) -> str:
  """An evaluation's records as TensorBoard's Markdown: per example its reward and whether it finished, then
  its prompt and completion as code blocks (their text shown as written)."""
  def block(text: str) -> str:
    return "\n".join("    " + line for line in str(text).split("\n"))
  parts = []
  for r in records:
    reward = "null" if r.get("reward") is None else f"{r['reward']:.4g}"
    head = f"**example {r['example']}**: reward {reward}, {'finished' if r.get('finished') else 'not finished'}"
    parts.append(f"{head}\n\nprompt:\n\n{block(r['prompt'])}\n\ncompletion:\n\n{block(r['completion'])}")
  return "\n\n---\n\n".join(parts)


def clear_outputs(workdir: str) -> None:
  """Removes the metric outputs of a run (used when a fresh run starts in a workdir with no checkpoint): a new
  W&B run starts too (its id file goes; W&B's local files under workdir/wandb/ stay, as an offline run's
  may not be synced yet)."""
  for name in OUTPUT_FILES:
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      os.remove(path)
  shutil.rmtree(os.path.join(workdir, "tensorboard"), ignore_errors=True)


def reward_components(rows: list[dict]) -> list[str]:
  """The names of the reward components `rows` log, sorted: `<name>` of each `reward/<name>` of the `rl` rows (a
  step's sampled mean) and of each `eval_reward/<name>` of the `eval` rows (the held-out greedy mean)."""
  prefixes = {"rl": envs.REWARD_PREFIX, "eval": EVAL_COMPONENT_PREFIX}
  return sorted({k[len(p):] for r in rows if (p := prefixes.get(r.get("phase"))) for k in r if k.startswith(p)})


def plot_curves(rows: list[dict], path: str) -> None:
  """Saves a PNG of the run's curves, one panel each, side by side: the RL reward (train and greedy eval, and
  each reward component a task reports, `reward_components`: its train curve dashed, its held-out one dotted
  with markers, in one colour per component); the KL to the reference (rows with `kl`: `loss.kl_coef > 0` or
  `loss.track_kl`); the warm-start SFT loss (`sft` rows: `sft.steps > 0`); with a learned critic (`value_loss`
  rows) its explained variance and value loss. A curve is drawn through its known points: a null (or NaN,
  inf) value, e.g. the explained variance of a batch whose returns do not vary, is skipped, and a lone point
  gets a marker. A panel with no known point is left out, not drawn as empty axes (the critic's panel holds
  whichever of its two curves has one); the reward panel is always there (it says so when no reward was
  logged either)."""
  import matplotlib  # pylint: disable=g-import-not-at-top  (optional outputs; heavy imports)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top  (optional outputs; heavy imports)

  def series(phase, key):
    pts = [(r["step"], r[key]) for r in rows
           if r.get("phase") == phase and r.get(key) is not None and math.isfinite(r[key])]
    return (np.array([p[0] for p in pts]), np.array([p[1] for p in pts])) if pts else (None, None)

  def line(ax, phase, key, *fmt, **kwargs):
    """`key`'s known points joined; a lone point (one known step) is a marker, not an invisible line."""
    x, y = series(phase, key)
    if x is not None:
      ax.plot(x, y, *fmt, **({"marker": "o"} if len(x) == 1 and not fmt else {}), **kwargs)

  def reward(ax):
    line(ax, "rl", "reward_mean", color="C0", label="train reward (sampled)", alpha=0.8)
    line(ax, "eval", "eval_reward", "o-", color="C1", label="eval reward (greedy, held out)")
    # A task's named reward components (the dataset task's `reward/<name>...`), after C0 and C1; a component's
    # train and held-out curves share its colour.
    for i, name in enumerate(reward_components(rows)):
      colour = f"C{(i + 2) % 10}"
      line(ax, "rl", envs.REWARD_PREFIX + name, "--", color=colour, label=envs.REWARD_PREFIX + name, alpha=0.7)
      line(ax, "eval", EVAL_COMPONENT_PREFIX + name, "o:", color=colour, label=EVAL_COMPONENT_PREFIX + name,
           alpha=0.7)
    ax.set(title="Reward", xlabel="RL step")
    if ax.lines:
      ax.legend()
    else:
      ax.text(0.5, 0.5, "no reward logged", ha="center", va="center", transform=ax.transAxes)

  def kl(ax):
    line(ax, "rl", "kl", color="tab:red")
    ax.set(title="KL to reference (k3, per token)", xlabel="RL step")

  def sft(ax):
    line(ax, "sft", "loss", color="tab:green")
    ax.set(title="Warm-start SFT loss", xlabel="SFT step")

  def has(phase, *keys):
    return any(series(phase, key)[0] is not None for key in keys)

  def critic(ax):
    # Explained variance (left) and value loss (right), or the one of them with a known point (explained
    # variance is null on every step whose returns do not vary).
    ev, vl = has("rl", "explained_variance"), has("rl", "value_loss")
    line(ax, "rl", "explained_variance", color="tab:purple", label="explained variance")
    if vl:
      line(ax.twinx() if ev else ax, "rl", "value_loss", color="tab:gray", alpha=0.7, label="value loss")
    what = {(True, True): "explained variance (left), value loss (right)", (True, False): "explained variance",
            (False, True): "value loss"}[ev, vl]
    ax.set(title=f"Critic: {what}", xlabel="RL step")

  panels = [reward] + [draw for draw, known in ((kl, has("rl", "kl")), (sft, has("sft", "loss")),
                                                (critic, has("rl", "explained_variance", "value_loss")))
                       if known]
  fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
  for draw, ax in zip(panels, axes[0]):
    draw(ax)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)


def write_json(path: str, payload: Any, **dump_kwargs) -> None:
  """`payload` as indented strict JSON at `path`, written aside and renamed over it: a reader (a sampler
  process reading the run's config.json as the learner starts) never sees a half-written file. A NaN or
  infinity in `payload` is a ValueError here (Python's json would write `NaN`, which is not JSON), and the
  file is left as it was."""
  tmp = path + ".tmp"
  try:
    with open(tmp, "w") as f:
      json.dump(payload, f, indent=2, allow_nan=False, **dump_kwargs)
  except ValueError as e:
    os.remove(tmp)
    raise ValueError(f"{path}: not written: {e} (a result must be a finite number or null).") from None
  os.replace(tmp, path)


def write_summary(path: str, summary: Mapping[str, Any]) -> None:
  """summary.json, its undefined figures (a NaN eval reward of a diverged run, say) as null: a run that
  trained to its end must not fail writing its summary."""
  write_json(path, strict_json(summary), sort_keys=True, default=str)
