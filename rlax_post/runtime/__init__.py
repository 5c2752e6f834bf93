"""The thin imperative shell: training loops (sync and async), checkpoints, metrics and progress."""

from rlax_post.runtime._async import load_run_config
from rlax_post.runtime._async import replay
from rlax_post.runtime._async import run_learner
from rlax_post.runtime._async import run_sampler
from rlax_post.runtime._async import SamplerWorker
from rlax_post.runtime._async import train_async
from rlax_post.runtime._checkpoint import RunCheckpointer
from rlax_post.runtime._metrics import MetricsWriter
from rlax_post.runtime._metrics import plot_curves
from rlax_post.runtime._sync import train

__all__ = ["load_run_config", "MetricsWriter", "plot_curves", "replay", "run_learner", "run_sampler",
           "RunCheckpointer", "SamplerWorker", "train", "train_async"]
