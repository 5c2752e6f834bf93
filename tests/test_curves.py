"""curves.png (`runtime.plot_curves`): one panel per curve the run logged, side by side, and no empty axes.

A run with no SFT warm start (`sft.steps = 0`, no `sft` rows) drew an empty "Warm-start SFT loss" panel, and one
with no KL (`loss.kl_coef = 0` without `loss.track_kl`, the schema's defaults) an empty KL panel.
"""

import struct
import warnings

import matplotlib.figure
import pytest

from rlax_post import runtime

_DPI_WIDTH = 5 * 90  # pixels per panel: 5 inches at the plot's 90 dpi


def _rows(*, sft: bool, kl: bool, critic: bool = False) -> list[dict]:
  rows = [{"phase": "sft", "step": s, "loss": 2.0 - 0.1 * s} for s in range(5)] if sft else []
  rows.append({"phase": "eval", "step": 0, "eval_reward": 0.1})
  for s in range(1, 6):
    row = {"phase": "rl", "step": s, "reward_mean": 0.1 * s, "reward/score": 0.1 * s}
    if kl:
      row["kl"] = 0.01 * s
    if critic:
      row.update(value_loss=1.0 / s, explained_variance=0.1 * s)
    rows.append(row)
  rows.append({"phase": "eval", "step": 5, "eval_reward": 0.4})
  return rows


def _plot(rows, path, monkeypatch) -> matplotlib.figure.Figure:
  """`plot_curves(rows, path)` with warnings as errors; returns the figure it saved."""
  saved, savefig = [], matplotlib.figure.Figure.savefig

  def recording_savefig(fig, *args, **kwargs):
    saved.append(fig)
    return savefig(fig, *args, **kwargs)

  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", recording_savefig)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # (a legend of no line warns)
    runtime.plot_curves(rows, str(path))
  assert len(saved) == 1
  return saved[0]


def _png_width(path) -> int:
  with open(path, "rb") as f:
    header = f.read(24)
  assert header[:8] == b"\x89PNG\r\n\x1a\n"
  return struct.unpack(">I", header[16:20])[0]


_REWARD, _KL, _SFT = "Reward", "KL to reference (k3, per token)", "Warm-start SFT loss"
_CRITIC = "Critic: explained variance (left), value loss (right)"


@pytest.mark.parametrize("sft, kl, critic, titles", [
    (True, True, False, [_REWARD, _KL, _SFT]),
    (False, True, False, [_REWARD, _KL]),
    (True, False, False, [_REWARD, _SFT]),
    (False, False, False, [_REWARD]),
    (False, True, True, [_REWARD, _KL, _CRITIC]),
], ids=["sft and kl", "no sft", "no kl", "reward only", "critic, no sft"])
def test_curves_draw_a_panel_per_logged_curve_and_no_empty_axes(tmp_path, monkeypatch, sft, kl, critic, titles):
  path = tmp_path / "curves.png"
  fig = _plot(_rows(sft=sft, kl=kl, critic=critic), path, monkeypatch)
  panels = [ax for ax in fig.axes if ax.get_title()]  # (the critic's value-loss twin shares its panel's title)
  assert [ax.get_title() for ax in panels] == titles
  assert len(fig.axes) == len(titles) + critic
  assert all(ax.lines for ax in fig.axes), [ax.get_title() for ax in fig.axes if not ax.lines]
  assert _png_width(path) == _DPI_WIDTH * len(titles)  # no room left for a missing panel
  reward = panels[0]
  assert [line.get_label() for line in reward.lines] == ["train reward (sampled)", "eval reward (greedy, held out)",
                                                         "reward/score"]
  if sft:
    assert list(panels[titles.index(_SFT)].lines[0].get_ydata()) == pytest.approx([2.0, 1.9, 1.8, 1.7, 1.6])


def test_curves_of_a_run_with_no_reward_row_say_so(tmp_path, monkeypatch):
  fig = _plot([{"phase": "sft", "step": 0, "loss": 2.0}], tmp_path / "curves.png", monkeypatch)
  assert [ax.get_title() for ax in fig.axes] == [_REWARD, _SFT]
  assert [t.get_text() for t in fig.axes[0].texts] == ["no reward logged"]
