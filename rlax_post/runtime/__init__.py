"""The thin imperative shell: training loops, checkpoints, metrics and progress."""

from rlax_post.runtime._checkpoint import RunCheckpointer
from rlax_post.runtime._metrics import MetricsWriter
from rlax_post.runtime._metrics import plot_curves
from rlax_post.runtime._sync import train

__all__ = ["MetricsWriter", "plot_curves", "RunCheckpointer", "train"]
