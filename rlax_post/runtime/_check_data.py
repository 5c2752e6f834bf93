"""`rlax-post check-data`: every row of the dataset task's files read before a run, through the run's own path.

A run reads the first `CHECK_ROWS` (256) train rows at start-up; a malformed row further on stops it when its
ticket comes (or is skipped and counted, `data.bad_rows = "skip"`), maybe hours in. `check_data` reads every
train and held-out row in file order with the run's split (`envs.dataset_rows`), renderer and tokenizer
(`envs.render_row`: the same checks, chat template and prompt budget), and counts per split the usable rows,
the prompts cut to `data.max_prompt_tokens` (`data.too_long = "truncate"`), the rows skipped for their length
(`"skip"`) and the malformed ones by reason (`data.row_error_reason`), keeping the first few messages (file and
line, or record / row number, and the reason), and with a warm start the train rows whose demonstration it cuts
to `rl.max_new_tokens` (`envs.demo_ids`). The held-out rows are read as the run reads them: up to its
`task.num_eval`-th usable one (the rows after it are counted as not read: a malformed one there stops no run).
`DataCheck.ok` is whether the run would go through them: no malformed row under `data.bad_rows = "error"` (a
prompt too long under `data.too_long = "error"` is one), and a usable row in each split; its verdict then says
how many rows were read and checked, of how many, and how many of them the run uses and skips.
A progress bar per split counts its rows read, on stderr as the run's steps' bar (none with `quiet` or
`runtime.progress = False`).
"""

from __future__ import annotations

import dataclasses

from rlax_post import config as config_lib
from rlax_post import data
from rlax_post import envs
from rlax_post.runtime import _metrics
from rlax_post.runtime import _parts

FIRST_BAD = 5  # malformed rows whose message a split's count keeps


@dataclasses.dataclass(frozen=True)
class SplitCheck:
  """One split's rows, every one read and rendered as the run would."""
  name: str  # "train" or "held-out"
  files: tuple[str, ...]
  rows: int  # rows in the split
  usable: int  # rows the run takes (cut ones included)
  truncated: int  # usable rows whose prompt is cut to data.max_prompt_tokens (too_long = "truncate")
  too_long: int  # rows skipped for their prompt's length (too_long = "skip")
  bad: dict[str, int]  # malformed rows by reason
  first_bad: tuple[str, ...]  # the first `FIRST_BAD` malformed rows' messages, in file order
  unread: int = 0  # held-out rows after the run's `task.num_eval` usable ones: the run reads none of them
  longest_skipped: int = 0  # the longest prompt skipped for its length, in tokens (0: none)
  demos_cut: int = 0  # usable rows whose demonstration the warm start cuts to rl.max_new_tokens (EOS lost)

  @property
  def num_bad(self) -> int:
    return sum(self.bad.values())

  def lines(self) -> list[str]:
    """"train: 400 rows in data/train.jsonl: 398 usable, 0 truncated, 0 skipped as too long, 2 malformed", then
    a line per reason ("  1 malformed: not valid JSON", most first) and the first malformed rows' messages."""
    files = ", ".join(self.files[:3]) + (f", ... ({len(self.files)} files)" if len(self.files) > 3 else "")
    unread = f", {self.unread} after the task.num_eval usable ones (not read by the run)" if self.unread else ""
    cut = (f"; {self.demos_cut} demonstrations longer than rl.max_new_tokens, which the warm start cuts (their EOS "
           "lost)") if self.demos_cut else ""
    out = [f"{self.name}: {self.rows} rows in {files}: {self.usable} usable, {self.truncated} truncated, "
           f"{self.too_long} skipped as too long, {self.num_bad} malformed{unread}{cut}"]
    out += [f"  {n} malformed: {reason}" for reason, n in sorted(self.bad.items(), key=lambda kv: (-kv[1], kv[0]))]
    if self.first_bad:
      more = f" ({len(self.first_bad)} of {self.num_bad})" if self.num_bad > len(self.first_bad) else ""
      out.append(f"  first malformed rows{more}:")
      out += [f"    {message}" for message in self.first_bad]
    return out


@dataclasses.dataclass(frozen=True)
class DataCheck:
  """Both splits' counts under the config's policies (`data.bad_rows`, `data.too_long`)."""
  splits: tuple[SplitCheck, ...]
  bad_rows: str
  too_long: str
  max_prompt_tokens: int

  @property
  def ok(self) -> bool:
    """Whether the run would read every row: no malformed row stops it, and each split has a usable row."""
    bad = sum(s.num_bad for s in self.splits)
    return (self.bad_rows != "error" or not bad) and all(s.usable for s in self.splits)

  def lines(self) -> list[str]:
    """The summary: a line per split, its first malformed rows indented below it, and a verdict."""
    return [line for s in self.splits for line in s.lines()] + [self._verdict()]

  def _verdict(self) -> str:
    empty = [s for s in self.splits if not s.usable]
    bad = sum(s.num_bad for s in self.splits)
    policies = f"data.bad_rows = {self.bad_rows!r}, data.too_long = {self.too_long!r}"
    if empty:
      why = "; ".join(_why_empty(s, self.max_prompt_tokens) for s in empty)
      return f"FAILED: no usable {' or '.join(s.name for s in empty)} row, so the run would stop: {why}."
    if bad and self.bad_rows == "error":
      return (f"FAILED: {bad} malformed rows would stop the run when it reaches them ({policies}); fix them, "
              "or set data.bad_rows = 'skip' to skip and count them.")
    return f"OK: {self._read()} ({policies}; skipped rows are counted in data_skipped)."

  def _read(self) -> str:
    """How many rows were read and checked, of how many, per split, and what the run does with them: until
    2026-12-06 the verdict said "the run reads every row" also where held-out rows past `task.num_eval` usable
    ones were not read, or rows were skipped."""
    read = [s.rows - s.unread for s in self.splits]
    skipped = sum(s.too_long + s.num_bad for s in self.splits)
    per_split = ", ".join(f"{s.name} {n} of {s.rows}" for s, n in zip(self.splits, read))
    return (f"{sum(read)} of {sum(s.rows for s in self.splits)} rows read and checked ({per_split}), as the run "
            f"reads them: {sum(s.usable for s in self.splits)} usable, {skipped} skipped")


def _why_empty(split: SplitCheck, budget: int) -> str:
  """Why `split` has no usable row: its most common malformed reason (the settings named until 2026-12-06
  were not the cause), and the length to raise `data.max_prompt_tokens` to where rows were skipped as too
  long."""
  parts = []
  if split.bad:
    reason, n = max(split.bad.items(), key=lambda kv: (kv[1], kv[0]))
    parts.append(f"{split.num_bad} of its {split.rows} rows malformed (most: {n} {reason}; the first are named "
                 "above)")
  if split.too_long:
    parts.append(f"{split.too_long} of its {split.rows} rows skipped as too long for data.max_prompt_tokens = "
                 f"{budget}{envs.skip_hint(split.longest_skipped)}")
  if not parts:
    parts.append("it holds no row")
  return f"{split.name}: {'; '.join(parts)}"


def _check_split(name: str, rows: data.Rows, indices, renderer: envs.Renderer, ui: _metrics.Console, *,
                 wanted: int | None = None, demo_budget: int | None = None) -> SplitCheck:
  """The split's rows read in order, under a progress bar of `ui`'s; with `wanted` (the held-out split's
  `task.num_eval`), only up to the `wanted`-th usable one, as the run reads them; with `demo_budget` (the train
  split's `rl.max_new_tokens` where a warm start reads demonstrations), the demonstrations longer are counted."""
  usable = truncated = too_long = unread = longest = demos_cut = 0
  bad: dict[str, int] = {}
  first_bad: list[str] = []
  progress = ui.bar(indices, desc=f"check-data: {name} rows", unit=" rows")
  for position, index in enumerate(progress):
    if usable == wanted:
      unread = len(indices) - position
      break
    try:
      out = envs.render_row(rows, int(index), renderer)
    except data.RowError as e:
      reason = data.row_error_reason(e, rows.where(int(index)))
      bad[reason] = bad.get(reason, 0) + 1
      if len(first_bad) < FIRST_BAD:
        first_bad.append(str(e))
      continue
    if isinstance(out, str):
      too_long += 1
      longest = max(longest, getattr(out, "tokens", 0))
    else:
      usable += 1
      truncated += out.truncated
      demos_cut += demo_budget is not None and len(envs.demo_ids(renderer, out)) > demo_budget
  if progress is not indices:  # a bar: its line ended here, also when the held-out split stops early
    progress.close()
  return SplitCheck(name=name, files=tuple(rows.files), rows=len(indices), usable=usable, truncated=truncated,
                    too_long=too_long, bad=bad, first_bad=tuple(first_bad), unread=unread, longest_skipped=longest,
                    demos_cut=demos_cut)


def check_data(cfg: config_lib.Config, tokenizer=None, *, quiet: bool = False) -> DataCheck:
  """Every train and held-out row of the dataset task's files read and rendered as the run would (module
  docstring); `tokenizer` None: the run's (`model.hf_path`'s, or the byte tokenizer); `quiet`: no progress bars.
  Another task is a ValueError naming it; the config's own mistakes (`check_config`) and unreadable files are
  ValueErrors too."""
  if cfg.task.name != envs.DatasetTask.name:
    raise ValueError(f"check-data reads the dataset task's files (task.name = {envs.DatasetTask.name!r}); this "
                     f"config's task is {cfg.task.name!r}, which reads no data files.")
  run_tokenizer = _parts.check_config(cfg)  # (built once: a checkpoint's tokenizer.json is read once)
  renderer = envs.dataset_renderer(cfg, run_tokenizer if tokenizer is None else tokenizer)
  (train_rows, train_idx), (eval_rows, eval_idx) = envs.dataset_rows(cfg)
  ui = _metrics.Console(quiet=quiet, progress=cfg.runtime.progress)
  demo_budget = cfg.rl.max_new_tokens if renderer.demos and cfg.data.demo_field is not None else None
  splits = (_check_split("train", train_rows, train_idx, renderer, ui, demo_budget=demo_budget),
            _check_split("held-out", eval_rows, eval_idx, renderer, ui, wanted=cfg.task.num_eval))
  return DataCheck(splits=splits, bad_rows=cfg.data.bad_rows, too_long=cfg.data.too_long,
                   max_prompt_tokens=cfg.data.max_prompt_tokens)
