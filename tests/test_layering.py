"""Import layering: every module imports only what the "Import layers" table of docs/architecture.md allows.

The check reads the sources of `rlax_post/`, `configs/`, `launch/` and `benchmarks/` with `ast` (nothing is
imported, so a broken module cannot hide a violation) and the allowed edges from the doc (so the doc and the
check cannot drift). It fails on
  a. an import of a package not in the importer's row (benchmarks may import any package);
  b. an import of another package's private module or name (a path component or name starting with `_`);
  c. an import cycle among rlax_post's modules (function-level imports included), or among packages;
  d. an import inside a function, unless of a heavy optional dependency (HEAVY_OPTIONAL) with a `#` reason;
and on a package without a row (or a row without a package).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
import dataclasses
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = "docs/architecture.md"
TREES = ("rlax_post", "configs", "launch", "benchmarks")

# Imported inside the one function that needs them: each is large or an optional extra that most runs never
# touch (plots, TensorBoard, W&B, the XManager launcher, HF parity and export, Arrow). Anything else belongs at
# the top of its module, where the import graph (and this test) can see it.
HEAVY_OPTIONAL = ("matplotlib", "tensorboardX", "wandb", "xmanager", "torch", "transformers", "pyarrow",
                  "safetensors.torch", "kubernetes", "google.cloud", "portpicker")

ANY = None  # A row whose package may import any package (public names only).
Layers = Mapping[str, frozenset[str] | None]


@dataclasses.dataclass(frozen=True)
class Violation:
  path: str
  line: int
  message: str


@dataclasses.dataclass(frozen=True)
class Import:
  """One imported module (and, for `from m import name` where name is no module, the name)."""
  line: int
  text: str  # The statement's source, for messages.
  target: str  # The resolved module, e.g. 'rlax_post.runtime._setup'.
  name: str | None  # An attribute imported from `target`, or None.
  in_function: bool
  type_checking: bool  # Under `if TYPE_CHECKING:` (never executed).
  reason: bool  # The statement's lines carry a `#` comment with words besides linter directives.


def read_layers(markdown: str) -> dict[str, frozenset[str] | None]:
  """The "Import layers" table: package -> the packages it may import (ANY for 'any package')."""
  if "\n## Import layers\n" not in markdown:
    raise ValueError("no '## Import layers' section")
  section = markdown.split("\n## Import layers\n", 1)[1].split("\n## ", 1)[0]
  rows = [line.strip() for line in section.splitlines() if line.startswith("|")]
  if not rows or rows[0].replace(" ", "") != "|package|mayimport|":
    raise ValueError(f"the table must start with '| package | may import |'; got {rows[:1]}")
  layers = {}
  for row in rows[2:]:
    cells = [c.strip() for c in row.strip("|").split("|")]
    package = re.fullmatch(r"`(\w+)`", cells[0]) if len(cells) == 2 else None
    if package is None or package.group(1) in layers:
      raise ValueError(f"bad or repeated row {row!r}")
    allowed = cells[1]
    if allowed.startswith("any package"):
      layers[package.group(1)] = ANY
    elif allowed == "—":
      layers[package.group(1)] = frozenset()
    elif re.fullmatch(r"`\w+`(, `\w+`)*", allowed):
      layers[package.group(1)] = frozenset(re.findall(r"`(\w+)`", allowed))
    else:
      raise ValueError(f"row {row!r}: may import must be `a`, `b`, ..., '—' or 'any package ...'")
  return layers


def module_of(path: str) -> str:
  """'rlax_post/sharding/__init__.py' -> 'rlax_post.sharding'; 'configs/demo.py' -> 'configs.demo'."""
  parts = path[:-len(".py")].split("/")
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str | None:
  """The layer a module belongs to ('sharding', 'cli', 'configs'), or None outside the checked trees."""
  parts = module.split(".")
  if parts[0] == "rlax_post":
    return parts[1] if len(parts) > 1 else None
  return parts[0] if parts[0] in TREES else None


def _is_private(part: str) -> bool:
  return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _comment_lines(source: str) -> dict[int, str]:
  """line -> its comment's text."""
  tokens = tokenize.generate_tokens(io.StringIO(source).readline)
  return {t.start[0]: t.string.lstrip("#") for t in tokens if t.type == tokenize.COMMENT}


def _gives_reason(comment: str) -> bool:
  comment = re.sub(r"\b(pylint|pytype|type)\s*:\s*[\w=,\-:]*|\bnoqa\b(:\s*[\w,]*)?", "", comment)
  return bool(re.search(r"[A-Za-z]{2}", comment))


def _is_type_checking(node: ast.AST) -> bool:
  test = node.test if isinstance(node, ast.If) else None
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
      isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
  """Every import statement with (inside a function, under `if TYPE_CHECKING`)."""
  stack = [(tree, False, False)]
  while stack:
    node, in_function, type_checking = stack.pop()
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node, in_function, type_checking
    in_function |= isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    for child in ast.iter_child_nodes(node):
      checking = type_checking or (_is_type_checking(node) and child in node.body)
      stack.append((child, in_function, checking))


def _base_module(node: ast.ImportFrom, module: str, is_init: bool) -> str:
  """The module `from <this> import ...` names, relative imports resolved against `module`."""
  if not node.level:
    return node.module
  parts = module.split(".")
  parts = parts[:len(parts) - node.level + (1 if is_init else 0)]
  return ".".join(parts + ([node.module] if node.module else []))


def parse_imports(source: str, path: str, modules: frozenset[str]) -> list[Import]:
  """The imports of one file, each resolved to a module (`from m import x`: m.x if that is a module)."""
  module, is_init = module_of(path), path.endswith("/__init__.py")
  tree = ast.parse(source, filename=path)
  comments = _comment_lines(source)
  lines = source.splitlines()
  tree_root = path.split("/")[0]
  out = []
  for node, in_function, type_checking in _statements(tree):
    text = " ".join(lines[i].strip() for i in range(node.lineno - 1, node.end_lineno))
    reason = any(_gives_reason(comments.get(i, "")) for i in range(node.lineno, node.end_lineno + 1))
    meta = dict(line=node.lineno, text=text, in_function=in_function, type_checking=type_checking,
                reason=reason)
    if isinstance(node, ast.Import):
      for alias in node.names:
        target = alias.name
        sibling = f"{tree_root}.{target}"  # A script folder's `import _harness` (benchmarks run as scripts).
        if tree_root != "rlax_post" and sibling in modules and target.split(".")[0] not in TREES:
          target = sibling
        out.append(Import(target=target, name=None, **meta))
      continue
    base = _base_module(node, module, is_init)
    for alias in node.names:
      candidate = f"{base}.{alias.name}"
      if alias.name != "*" and (candidate in modules or base not in modules):
        out.append(Import(target=candidate, name=None, **meta))
      else:
        out.append(Import(target=base, name=None if alias.name == "*" else alias.name, **meta))
  return sorted(out, key=lambda i: i.line)


def _check_import(path: str, package: str, imp: Import, layers: Layers) -> list[Violation]:
  """Rules a, b and d for one import."""
  out = []
  where = (path, imp.line)
  target_package = package_of(imp.target)
  if target_package is not None and target_package != package:
    allowed = layers.get(package, frozenset())
    if allowed is not ANY and target_package not in allowed and package in layers:
      out.append(Violation(*where, f"{package} may not import {target_package}: {imp.text}"))
    private = [p for p in imp.target.split(".")[1:] if _is_private(p)]
    if imp.name is not None and _is_private(imp.name):
      private.append(imp.name)
    if private:
      out.append(Violation(*where, f"private {'.'.join(private)} of package {target_package}: {imp.text}"))
  if imp.in_function and not imp.type_checking:
    heavy = any(imp.target == h or imp.target.startswith(h + ".") for h in HEAVY_OPTIONAL)
    if not heavy:
      out.append(Violation(*where, f"import inside a function (move it to the top): {imp.text}"))
    elif not imp.reason:
      out.append(Violation(*where, f"heavy optional import inside a function needs a '# reason': {imp.text}"))
  return out


def _check_rows(packages: set[str], layers: Layers) -> list[Violation]:
  out = [Violation(DOC, 0, f"package {p} has no row in the Import layers table")
         for p in sorted(packages - set(layers))]
  out += [Violation(DOC, 0, f"the Import layers table has a row for {p}, which does not exist")
          for p in sorted(set(layers) - packages)]
  for p, allowed in sorted(layers.items()):
    out += [Violation(DOC, 0, f"row {p} allows {q}, which does not exist")
            for q in sorted((allowed or frozenset()) - packages)]
  return out


def _cycles(edges: Mapping[str, Mapping[str, tuple[str, int]]]) -> list[list[str]]:
  """One cycle (a list of nodes, first repeated last) per strongly connected component that has one."""
  index, low, on_stack, stack, components = {}, {}, set(), [], []

  def visit(v):  # Tarjan's algorithm; recursion depth is bounded by the few hundred modules here.
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(edges.get(v, {})):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = {v}
      while stack[-1] != v:
        component.add(stack.pop())
      stack.pop()
      on_stack.difference_update(component)
      if len(component) > 1 or v in edges.get(v, {}):
        components.append(component)

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return [_shortest_cycle(min(c), c, edges) for c in components]


def _shortest_cycle(start: str, component: set[str], edges) -> list[str]:
  """The shortest path start -> ... -> start inside `component` (breadth first)."""
  parent, frontier = {}, [start]
  while frontier:
    nxt = []
    for v in frontier:
      for w in sorted(edges.get(v, {})):
        if w == start:
          path = [v]
          while path[-1] != start:
            path.append(parent[path[-1]])
          return path[::-1] + [start]
        if w in component and w not in parent:
          parent[w] = v
          nxt.append(w)
    frontier = nxt
  raise AssertionError(f"no cycle through {start}")


def _cycle_violation(kind: str, cycle: list[str], edges) -> Violation:
  hops = [f"{a} ({edges[a][b][0]}:{edges[a][b][1]})" for a, b in zip(cycle, cycle[1:])]
  path, line = edges[cycle[0]][cycle[1]]
  return Violation(path, line, f"{kind} import cycle: {' -> '.join(hops)} -> {cycle[-1]}")


def _add_module_edges(edges, module: str, path: str, imp: Import, modules: frozenset[str]) -> None:
  """Edges module -> target, plus -> each package __init__ above the target that does not hold `module`
  (Python runs it first; a package's own __init__ is already running when its modules import each other)."""
  parts = imp.target.split(".")
  for k in range(2, len(parts) + 1):
    target = ".".join(parts[:k])
    inside = module == target or module.startswith(target + ".")
    if target in modules and (k == len(parts) or not inside) and target != module:
      edges.setdefault(module, {}).setdefault(target, (path, imp.line))


def check(sources: Mapping[str, str], layers: Layers) -> list[Violation]:
  """Every violation of the rules (module docstring) in `sources` (repo-relative path -> source text)."""
  modules = frozenset(module_of(p) for p in sources)
  packages = {package_of(m) for m in modules} - {None}
  out = _check_rows(packages, layers)
  module_edges, package_edges = {}, {}
  for path, source in sorted(sources.items()):
    module, package = module_of(path), package_of(module_of(path))
    for imp in parse_imports(source, path, modules):
      out += _check_import(path, package, imp, layers)
      if imp.type_checking:
        continue
      target_package = package_of(imp.target)
      if target_package is not None and target_package != package:
        package_edges.setdefault(package, {}).setdefault(target_package, (path, imp.line))
      if module.startswith("rlax_post.") and imp.target.startswith("rlax_post."):
        _add_module_edges(module_edges, module, path, imp, modules)
  out += [_cycle_violation("module", c, module_edges) for c in _cycles(module_edges)]
  out += [_cycle_violation("package", c, package_edges) for c in _cycles(package_edges)]
  return list(dict.fromkeys(out))  # `from m import a, b` inside a function is one violation, not two.


def report(violations: Iterable[Violation]) -> str:
  """Violations grouped by file, in line order."""
  by_file = {}
  for v in sorted(violations, key=lambda v: (v.path, v.line, v.message)):
    by_file.setdefault(v.path, []).append(f"  {v.path}:{v.line}: {v.message}")
  return "\n".join(f"{path} ({len(lines)}):\n" + "\n".join(lines) for path, lines in by_file.items())


def repository_sources() -> dict[str, str]:
  return {p.relative_to(ROOT).as_posix(): p.read_text()
          for tree in TREES for p in sorted((ROOT / tree).rglob("*.py"))}


def test_repository_follows_the_import_layers():
  layers = read_layers((ROOT / DOC).read_text())
  sources = repository_sources()
  assert len(sources) > 50 and "rlax_post/learner/__init__.py" in sources, sorted(sources)[:5]
  violations = check(sources, layers)
  assert not violations, f"{len(violations)} import-layer violations:\n{report(violations)}"


# The checker on synthetic trees: it must flag what it claims to flag, and accept what is allowed.

LAYERS = {"low": frozenset(), "mid": frozenset({"low"}), "top": frozenset({"mid", "low"}), "benchmarks": ANY}


def _check(files: Mapping[str, str], layers: Layers = LAYERS) -> list[tuple[str, int, str]]:
  base = {"rlax_post/low/__init__.py": "X = 1\n", "rlax_post/low/_impl.py": "Y = 2\n",
          "rlax_post/mid/__init__.py": "", "rlax_post/top/__init__.py": "", "benchmarks/_harness.py": ""}
  return [(v.path, v.line, v.message) for v in check({**base, **files}, layers)]


def test_the_doc_table_reads_as_decided():
  layers = read_layers((ROOT / DOC).read_text())
  assert layers["learner"] == {"models", "losses", "sharding"}
  assert layers["config"] == frozenset() and layers["models"] == {"sharding"}
  assert layers["cli"] == {"runtime", "sweep", "config", "sampler", "models"}
  assert layers["benchmarks"] is ANY
  assert len(layers) == 18


def test_read_layers_rejects_a_malformed_table():
  with pytest.raises(ValueError, match="no '## Import layers' section"):
    read_layers("# x\n")
  with pytest.raises(ValueError, match="may import must be"):
    read_layers("\n## Import layers\n| package | may import |\n|---|---|\n| `a` | b, c |\n")
  with pytest.raises(ValueError, match="bad or repeated row"):
    read_layers("\n## Import layers\n| package | may import |\n|---|---|\n| `a` | — |\n| `a` | — |\n")


def test_accepts_allowed_public_and_own_private_imports():
  files = {"rlax_post/mid/_a.py": "from rlax_post import low\nfrom rlax_post.low import X\n"
                                  "from rlax_post.mid import _b\nfrom . import _b as b2\n",
           "rlax_post/mid/_b.py": "import rlax_post.low\nimport numpy as np\n",
           "benchmarks/run.py": "import _harness\nfrom rlax_post import top, mid\n"}
  assert _check(files) == []


def test_flags_a_package_outside_the_row():
  got = _check({"rlax_post/low/_c.py": "import os\n\nfrom rlax_post.mid import thing\n"})
  assert got == [("rlax_post/low/_c.py", 3, "low may not import mid: from rlax_post.mid import thing")]


@pytest.mark.parametrize("statement", ["from rlax_post.low import _impl", "import rlax_post.low._impl",
                                       "from rlax_post.low._impl import Y", "from ..low import _impl",
                                       "from rlax_post.low import _hidden_name"])
def test_flags_another_packages_private_module(statement):
  got = _check({"rlax_post/mid/_a.py": statement + "\n"})
  assert len(got) == 1 and got[0][:2] == ("rlax_post/mid/_a.py", 1), got
  assert "private _" in got[0][2] and "of package low" in got[0][2] and statement in got[0][2], got


def test_flags_private_imports_in_benchmarks_too():
  got = _check({"benchmarks/run.py": "from rlax_post.top import _setup\n"})
  assert got == [("benchmarks/run.py", 1, "private _setup of package top: from rlax_post.top import _setup")]


def test_flags_a_module_cycle_hidden_in_a_function():
  # low/_impl imports mid lazily; mid imports low._impl's package at the top: low -> mid is also a layer break,
  # and the cycle must be reported on its own (module and package level).
  got = _check({"rlax_post/low/_impl.py": "def f():\n  from rlax_post import mid\n",
                "rlax_post/low/__init__.py": "from rlax_post.low import _impl\n",
                "rlax_post/mid/__init__.py": "from rlax_post import low\n"},
               layers={**LAYERS, "low": frozenset({"mid"})})
  messages = [m for _, _, m in got]
  assert ("import inside a function (move it to the top): from rlax_post import mid") in messages
  module_cycles = [m for m in messages if m.startswith("module import cycle")]
  assert module_cycles == ["module import cycle: rlax_post.low (rlax_post/low/__init__.py:1) -> "
                           "rlax_post.low._impl (rlax_post/low/_impl.py:2) -> "
                           "rlax_post.mid (rlax_post/mid/__init__.py:1) -> rlax_post.low"], messages
  assert [m for m in messages if m.startswith("package import cycle")] == [
      "package import cycle: low (rlax_post/low/_impl.py:2) -> mid (rlax_post/mid/__init__.py:1) -> low"]


def test_a_package_importing_its_own_modules_is_no_cycle():
  got = _check({"rlax_post/mid/__init__.py": "from rlax_post.mid._a import A\n",
                "rlax_post/mid/_a.py": "from rlax_post.mid import _b\nA = 1\n",
                "rlax_post/mid/_b.py": "import rlax_post.mid._c\n", "rlax_post/mid/_c.py": ""})
  assert got == []


def test_function_level_imports_need_a_heavy_dependency_and_a_reason():
  source = ("def plot():\n"
            "  import matplotlib.pyplot as plt  # optional extra, plots only\n"
            "  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top\n"
            "  import json  # stdlib is never heavy\n"
            "  from transformers import (  # HF parity only\n"
            "      AutoModel)\n"
            "  from os import path, sep\n")
  got = _check({"rlax_post/top/_plot.py": source})
  assert got == [
      ("rlax_post/top/_plot.py", 3, "heavy optional import inside a function needs a '# reason': "
                                    "from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top"),
      ("rlax_post/top/_plot.py", 4, "import inside a function (move it to the top): "
                                    "import json  # stdlib is never heavy"),
      ("rlax_post/top/_plot.py", 7, "import inside a function (move it to the top): from os import path, sep"),
  ]


def test_type_checking_imports_are_not_executed_edges():
  source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from rlax_post import top\n"
  got = _check({"rlax_post/mid/_t.py": source, "rlax_post/top/_u.py": "from rlax_post import mid\n"})
  assert got == [("rlax_post/mid/_t.py", 3, "mid may not import top: from rlax_post import top")]


def test_every_package_needs_a_row():
  got = _check({"rlax_post/extra/__init__.py": ""})
  assert got == [(DOC, 0, "package extra has no row in the Import layers table")]
  got = _check({}, layers={**LAYERS, "gone": frozenset({"low", "nowhere"})})
  assert got == [(DOC, 0, "the Import layers table has a row for gone, which does not exist"),
                 (DOC, 0, "row gone allows nowhere, which does not exist")]


def test_report_groups_by_file():
  text = report([Violation("b.py", 2, "y"), Violation("a.py", 9, "x"), Violation("b.py", 1, "z")])
  assert text == "a.py (1):\n  a.py:9: x\nb.py (2):\n  b.py:1: z\n  b.py:2: y"
