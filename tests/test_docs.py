"""Every ```python block of the capability docs runs, in order, as one script per page."""

import pathlib
import re

import pytest

_DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("page", ["credit_assignment.md"])
def test_code_blocks_run(page):
  text = (_DOCS / page).read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
  assert blocks, page
  namespace = {}
  for block in blocks:
    exec(compile(block, f"{page}", "exec"), namespace)  # pylint: disable=exec-used
