"""Reading a finished run back in tests: its checkpoints restored onto the run's own mesh."""

import jax
import numpy as np

from rlax_post import runtime


def restore(workdir, cfg, step):
  """(state, reference params, meta) of run `workdir` at checkpoint `step`."""
  update = runtime.RLUpdate(runtime.build_parts(cfg))
  ckpt = runtime.RunCheckpointer(workdir, tidy=False)
  try:
    return ckpt.restore(step, **update.checkpoint_templates)
  finally:
    ckpt.close()


def max_param_change(workdir, cfg, step_a, step_b) -> float:
  """Max |params(step_b) - params(step_a)| over the trained params of run `workdir`: a test that loads step K
  rather than another can only tell them apart (catch a wrong step) when this is > 0."""
  params_a, params_b = (restore(workdir, cfg, step)[0].params for step in (step_a, step_b))
  return max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
             for a, b in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b), strict=True))
