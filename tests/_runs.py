"""Reading a finished run back in tests: its checkpoints restored onto the run's own mesh."""

from rlax_post import runtime


def restore(workdir, cfg, step):
  """(state, reference params, meta) of run `workdir` at checkpoint `step`."""
  update = runtime.RLUpdate(runtime.build_parts(cfg))
  ckpt = runtime.RunCheckpointer(workdir, tidy=False)
  try:
    return ckpt.restore(step, **update.checkpoint_templates)
  finally:
    ckpt.close()
