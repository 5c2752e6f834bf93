"""`make_task`: task name -> configured task."""

import dataclasses

from rlax_post.envs import _base
from rlax_post.envs import _tasks

TASKS = {
    cls.name: cls
    for cls in (_tasks.ReverseTask, _tasks.SortTask, _tasks.AddTask)
}


def make_task(name: str, **kwargs) -> _base.Task:
  """Builds the task called `name` with options `kwargs`.

  Args:
    name: one of `sorted(TASKS)`: 'add', 'reverse', 'sort'.
    **kwargs: the task's options (its dataclass fields), e.g.
      `make_task('reverse', max_len=8, partial_credit=True)`.

  Returns:
    The task, validated.

  Raises:
    ValueError: for an unknown name, an unknown option or a bad value.
  """
  if name not in TASKS:
    raise ValueError(
        f'Task name must be one of {sorted(TASKS)}; got {name!r}.')
  cls = TASKS[name]
  options = sorted(f.name for f in dataclasses.fields(cls))
  unknown = sorted(set(kwargs) - set(options))
  if unknown:
    raise ValueError(
        f'Unknown option(s) {unknown} for task {name!r}; valid options are '
        f'{options}.')
  return cls(**kwargs)
