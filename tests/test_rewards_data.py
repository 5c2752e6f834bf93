"""The dataset task's rewards: maths answer matching on adversarial strings, the built-ins, functions named
in a config (`Scorer`) and their threaded runner (errors, timeouts)."""

from fractions import Fraction
import logging
import re
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from rlax_post import rewards
from rlax_post.rewards import _runner


def _sample(completion, answer=None, ids=(), **kw):
  return rewards.Sample(prompt="p", prompt_text="p", completion=completion, completion_ids=tuple(ids),
                        answer=answer, where="f.jsonl:3", **kw)


@pytest.mark.parametrize("text, expected", [
    ("The answer is 1,234.", "1,234"),
    ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
    ("first \\boxed{3} then \\boxed{4}", "4"),
    ("\\boxed{\\text{(A)}}", "\\text{(A)}"),
    ("\\boxed{} and 7", "7"),  # an empty box is no answer: the last number
    ("\\boxed{12", "12"),  # unclosed: the last number
    ("work...\n#### 1,000,000\n", "1,000,000"),
    ("#### The answer is 42.", "42"),  # a stated answer after ####: read as one (it was all of the text)
    ("#### So x = 5, as shown.", "So x = 5, as shown."),  # no stated answer: the line, as before
    ("Final answer: -3/4", "-3/4"),
    ("12 apples and 13 oranges", "13"),
    ("1,2,3", "3"),  # not a thousands-grouped number: three numbers
    ("5-3 = 2", "2"),
    ("x2 y", None),  # a digit inside a word is no number
    ("\u22127", "-7"),
    ("so it is 1{,}000", "1,000"),  # LaTeX's thousands separator: one number, not "000"
    ("\\boxed{1{,}000}", "1,000"),
    ("no numbers at all", None),
    ("", None),
])
def test_extract_answer(text, expected):
  assert rewards.extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    # A stated answer runs to the end of its sentence; when that is no number, its beginning that is one
    # and ends before a clause.
    ("So the answer is 42, which is even.", "42"),
    ("The answer is 42 because 6*7=42.", "42"),
    ("The answer is 12 apples because he had 12.", "12"),
    ("The answer is 42 (six times seven).", "42"),  # a bracketed remark: no place for a number's units
    ("The answer is: 42 (apples)", "42"),
    ("The answer is 5 (or 6).", "5 (or 6)"),
    # The Minerva / lm-eval MATH format: "Final Answer:" opens the phrase that states the answer.
    ("Final Answer: The final answer is 42. I hope it is correct.", "42"),
    ("**Final Answer:** The final answer is $\\frac{1}{2}$. I hope it is correct.", "$\\frac{1}{2}$"),
    ("Answer: the answer is 7", "7"),
    ("The answer is 42, since checking the answer is easy.", "42"),
    ("The answer is 5 million, which is a lot.", "5 million"),  # a scale word is no place to stop
    ("The answer is x = 5, since x + 1 = 6.", "x = 5"),
    ("The answer is $\\frac{1}{2}$, as shown.", "$\\frac{1}{2}$"),
    # Not before a word of arithmetic or of doubt, a one-letter word or a symbol: all of it, as before.
    ("The answer is 5 and 7, respectively.", "5 and 7, respectively"),
    ("The answer is 3, or maybe 4.", "3, or maybe 4"),
    ("The answer is 3, but perhaps 4.", "3, but perhaps 4"),
    ("The answer is 2 x + 1, clearly.", "2 x + 1, clearly"),
    ("The answer is 2 + 3 = 5 apples.", "2 + 3 = 5 apples"),
    ("The answer is " + "9" * 120 + " because it is.", "9" * 120 + " because it is"),  # no clause early on
    ("The answer is x" + " " * 20000 + "+1", "x" + " " * 20000 + "+1"),  # clauses sought in 100 characters
])
def test_extract_answer_stated_then_more(text, expected):
  assert rewards.extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("\\boxed{" * 20000, None),  # 140k characters, no box closes, no number
    ("\\boxed{" * 20000 + "7", "7"),  # no box closes: the last number
    ("\\boxed{" * 20000 + "7}", "7"),  # only the innermost box closes
    ("\\boxed{5} " + "\\boxed{" * 20000, "5"),  # the last box that closes
    ("\\boxed{" * 20000 + "\\boxed{}}", "\\boxed{}"),  # the innermost is empty: the box around it
])
def test_extract_answer_on_many_unclosed_boxes(text, expected):
  # A model repeating "\boxed{" until its token budget: brace matching is one pass, so this takes
  # milliseconds (scanning forward from each box took minutes at this length).
  assert rewards.extract_answer(text) == expected


@pytest.mark.parametrize("s, expected", [
    ("42", Fraction(42)), ("-0.50", Fraction(-1, 2)), ("1,234,567", Fraction(1234567)),
    ("$1,299.99", Fraction(129999, 100)), ("\\frac{3}{4}", Fraction(3, 4)), ("\\dfrac{-6}{8}", Fraction(-3, 4)),
    ("3 / 4", Fraction(3, 4)), ("50%", Fraction(50)), ("72 dollars", Fraction(72)), (".5", Fraction(1, 2)),
    ("1e3", 1000.0), ("\\$ 5", Fraction(5)), ("1/0", None), ("12,34", None), ("abc", None), ("3 + 4", None),
    ("\\text{7}", Fraction(7)), ("1/2/3", None), ("6 / 2 / 3", None), ("\\frac{1/2}{3}", Fraction(1, 6)),
    # (no number until 2026-12-06) quoted whole; a mixed number; scientific notation as LaTeX writes it
    ('"42"', Fraction(42)), ("\u201c-3\u201d", Fraction(-3)), ("2 1/2", Fraction(5, 2)),
    ("-2\\frac{1}{2}", Fraction(-5, 2)),
    ("2 3/2", None), ("2 0/3", None), ("3 \\times 10^{5}", Fraction(300000)), ("1.5\\cdot10^{-3}", Fraction(3, 2000)),
    ("2 × 10^6", Fraction(2_000_000)), ("x \\times 10^5", None),
])
def test_parse_number(s, expected):
  got = rewards.parse_number(s)
  assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("s, expected", [
    # Letters written against a number, one-letter words and words of arithmetic are not units.
    ("2x", None), ("3i", None), ("2 x", None), ("2 e", None), ("5 squared", None), ("3 and 4", None),
    ("2 pi", None), ("2x dollars", None),
    # Unit symbols, spaced or not, are units (a review of the first version of this rule: "3 m", "5 g", "5cm"
    # had turned from right to wrong).
    ("5 m", Fraction(5)), ("5 g", Fraction(5)), ("12 s", Fraction(12)), ("10 L", Fraction(10)),
    ("5cm", Fraction(5)), ("10kg", Fraction(10)),
    # Unit words: whitespace, then words of two letters or more; `\\text{}` counts as apart.
    ("72 dollars", Fraction(72)), ("5 km per hour", Fraction(5)), ("5\\text{cm}", Fraction(5)),
    ("2 \\text{ cm}", Fraction(2)), ("3/4 cups", Fraction(3, 4)),
    # A scale word first multiplies; anywhere else, or in the plural, it is no number.
    ("5 million", Fraction(5_000_000)), ("2.5 billion", Fraction(2_500_000_000)), ("3 hundred", Fraction(300)),
    ("2 thousand dollars", Fraction(2000)), ("1.5e3 Trillion", 1.5e15), ("5 millions", None),
    # A rate: the number with its unit, then "/" and a unit (no number until 2026-12-06); not "1/x".
    ("5 m/s", Fraction(5)), ("9.8 m/s^2", Fraction(49, 5)), ("60 km/h", Fraction(60)), ("1/x", None),
    ("5/s", None),
    ("5 dollars million", None), ("5 hundred thousand", None),
    # Scientific notation with a unit after it, as a plain number takes one (no number until 2026-12-06).
    ("3.0 \\times 10^8 m/s", Fraction(300_000_000)), ("3 \\times 10^{8}\\text{ m/s}", Fraction(300_000_000)),
    ("2 × 10^6 dollars", Fraction(2_000_000)), ("1.5\\cdot10^{-3} s", Fraction(3, 2000)),
    ("3 \\times 10^8kg", Fraction(300_000_000)), ("2 \\times 10^3 \\times 10^2 m", Fraction(200_000)),
    ("3 \\times 10^8 x", None), ("3 \\times 10^8 squared", None), ("3 \\times 10^82", None),
    ("x \\times 10^5 m", None),
])
def test_parse_number_units_and_scale_words(s, expected):
  got = rewards.parse_number(s)
  assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("s, expected", [
    ("-\\frac{1}{2}", Fraction(-1, 2)), ("- \\dfrac{3}{4}", Fraction(-3, 4)), ("+\\frac{1}{2}", Fraction(1, 2)),
    ("-\\frac{-1}{2}", Fraction(1, 2)), ("\\frac12", Fraction(1, 2)), ("-\\frac12", Fraction(-1, 2)),
    ("\\frac1{4}", Fraction(1, 4)), ("\\tfrac{3}4", Fraction(3, 4)), ("\\frac 3 4", Fraction(3, 4)),
    ("\\frac123", None),  # \frac{1}{2}3: no number
    ("1{,}000", Fraction(1000)), ("-1{,}234{,}567.5", Fraction(-2469135, 2)), ("12{,}34", None),
])
def test_parse_number_latex_forms(s, expected):
  got = rewards.parse_number(s)
  assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("s, expected", [
    ("x = 5", Fraction(5)), ("x=\\frac{1}{2}", Fraction(1, 2)), ("y = -3.5", Fraction(-7, 2)),
    ("n = 1,000 dollars", Fraction(1000)),
    # Only one letter and "=", at the start, of the whole answer.
    ("xy = 5", None), ("f(x) = 5", None), ("x == 5", None), ("x =", None), ("5/x = 3", None), ("2x = 10", None),
])
def test_parse_number_after_a_variable(s, expected):
  got = rewards.parse_number(s)
  assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("a, b, same", [
    ("-0.50", "-1/2", True), ("\\frac{1}{2}", "0.5", True), ("1,234", "1234", True), ("72 dollars", "72", True),
    ("(A)", "(a)", True), ("3.14159", "3.1416", False), ("0.1", "0.1000000001", True), ("7", "-7", False),
    (None, "3", False), ("x + 1", "x+1", True),
    # (different until 2026-12-06) a choice letter with or without brackets; quotes; \sqrt2; \dfrac
    ("(B)", "B", True), ("(B)", "C", False), ('"Paris"', "Paris", True), ("\\sqrt2", "\\sqrt{2}", True),
    ('"Paris."', "Paris", True), ("\u201cParis.\u201d", "Paris", True), ('"**42**"', "42", True),  # (American quoting)
    ("\\dfrac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}", True), ("\\sqrt23", "\\sqrt{23}", False),
])
def test_answers_match(a, b, same):
  assert rewards.answers_match(a, b) is same


@pytest.mark.parametrize("a, b, same", [
    # Integers and fractions are exact: any difference is a different answer.
    ("1000001", "1000000", False), ("12345679", "12345678", False), ("10000001/10000000", "1", False),
    ("\\frac{2}{4}", "1/2", True),
    # So is a whole number written as a decimal or exponent (a float reference 1000000.0).
    ("1000001", "1000000.0", False), ("1e6", "1000001", False), ("12", "12.0", True), ("1e6", "1,000,000", True),
    # Not an exponent's float off the decimal it prints as: 6.02e23 is a float 4194304 below 6.02 x 10^23 (until
    # 2026-12-06 a whole "exact" number, which `\boxed{6.02 \times 10^{23}}` and 6.02e23's digits never matched).
    ("6.02 \\times 10^{23}", "6.02e23", True), ("602000000000000000000000", "6.02e+23", True),
    ("3.0 \\times 10^8 m/s", "3e8", True), ("3.0 \\times 10^8 m/s", "3.1e8", False),
    ("1e16", "10000000000000001", False),
    # A decimal that is not whole is an approximation: it matches when the difference is below
    # max(rel_tol * max(|a|, |b|), abs_tol), in exact arithmetic. 0.333333 is off from 1/3 by exactly
    # one part in 10^6, which is not below rel_tol = 1e-6; 0.3333333 is off by one part in 10^7.
    ("0.333333", "1/3", False), ("0.3333333", "1/3", True), ("0.6666666666666666", "2/3", True),
    ("1000000.5", "1000000", True),  # off by 5e-7 of 1000000.5
])
def test_answers_match_exact_values_exactly_decimals_within_tolerance(a, b, same):
  assert rewards.answers_match(a, b) is same
  assert rewards.answers_match(b, a) is same


def test_numbers_too_large_for_a_float():
  assert rewards.parse_number("1e3/" + "9" * 400) is None  # a float over an integer beyond float range
  # Compared in exact arithmetic: off by 0.5 in about 10^400, an approximation within rel_tol.
  assert rewards.answers_match("9" * 400 + ".5", "9" * 400)
  assert not rewards.answers_match("9" * 400 + "1", "9" * 400 + "0")


def test_numbers_with_more_digits_than_python_reads_are_no_number():
  # A model repeating a digit until its token budget: int("3" * 5000) raises ValueError (Python's 4300-digit
  # limit), which made the built-in reward raise (the sample got `reward.default` and an error) instead of 0.
  assert rewards.parse_number("3" * 5000) is None and rewards.parse_number("0." + "3" * 5000) is None
  assert rewards.math_answer(_sample("So it is " + "3" * 5000, answer=3)) == 0.0
  assert rewards.math_answer(_sample("\\boxed{" + "3" * 5000 + "}", answer="3" * 5000)) == 1.0  # equal texts
  assert rewards.math_answer(_sample("\\boxed{7}", answer="3" * 5000)) == 0.0


def test_answers_match_tolerances():
  assert rewards.answers_match("0.333333", "1/3", rel_tol=1.01e-6)  # now 10^-6 is below the tolerance
  assert rewards.answers_match("0.1", "0.1000000001", abs_tol=0.0)  # relative 10^-9 < 10^-6 still
  assert rewards.answers_match("0.1", "0.1000000001", rel_tol=0, abs_tol=1.01e-10)
  assert not rewards.answers_match("0.1", "0.1000000001", rel_tol=0, abs_tol=1e-10)  # exactly 1e-10 apart
  assert not rewards.answers_match("1000001", "1000000", rel_tol=0.1)  # no tolerance for integers
  for bad in (-1e-6, float("nan"), float("inf"), "1e-6", True):
    with pytest.raises(ValueError, match=r"rel_tol must be a finite number >= 0; got"):
      rewards.answers_match("1", "1", rel_tol=bad)
  with pytest.raises(ValueError, match=r"abs_tol must be a finite number >= 0; got -1"):
    rewards.answers_match("1", "1", abs_tol=-1)


def test_math_reward_reads_answers_in_markdown_bold():
  # A chat model's bold answer read as no number ("**42**", "** 42", "42**"), so a right answer scored 0.
  assert rewards.math_answer(_sample("The answer is **42**.", answer=42)) == 1.0
  assert rewards.math_answer(_sample("**Answer:** 42", answer=42)) == 1.0
  assert rewards.math_answer(_sample("**Final answer: 42**", answer=42)) == 1.0
  assert rewards.math_answer(_sample("The answer is **42**, which is even.", answer=42)) == 1.0
  assert rewards.math_answer(_sample("The answer is **(B)**.", answer="(B)")) == 1.0
  assert rewards.math_answer(_sample("The answer is **41**.", answer=42)) == 0.0
  assert rewards.parse_number("2*3") is None


def test_math_reward_reads_answers_in_latex_math_delimiters():
  # `$...$` was dropped but `\\(...\\)`, `\\[...\\]` and `\\displaystyle` were kept, so the answer read as no number.
  assert rewards.math_answer(_sample("The answer is \\(42\\).", answer=42)) == 1.0
  assert rewards.math_answer(_sample("The answer is \\(\\frac{1}{2}\\).", answer=0.5)) == 1.0
  assert rewards.math_answer(_sample("Answer: \\[42\\]", answer=42)) == 1.0
  assert rewards.math_answer(_sample("\\boxed{\\displaystyle \\frac{1}{2}}", answer="1/2")) == 1.0
  assert rewards.math_answer(_sample("The answer is \\(41\\).", answer=42)) == 0.0
  assert rewards.answers_match("\\left[ 1, 2 \\right]", "[1,2]")  # brackets written with \\left and \\right kept


def test_math_reward_reads_degrees():
  # MATH's geometry references are written `90^\\circ`: with the mark kept, neither `\\boxed{90}` nor
  # `\\boxed{90^{\\circ}}` read as the same number, and a right answer scored 0.
  assert rewards.math_answer(_sample("\\boxed{90}", answer="\\boxed{90^\\circ}")) == 1.0
  assert rewards.math_answer(_sample("\\boxed{90^{\\circ}}", answer="90")) == 1.0
  assert rewards.math_answer(_sample("The angle is 90\u00b0.", answer="90^\\circ")) == 1.0
  assert rewards.math_answer(_sample("\\boxed{45^\\circ}", answer="90^\\circ")) == 0.0


def test_math_reward_reads_references_of_every_kind():
  assert rewards.math_answer(_sample("so it is 19", answer=19)) == 1.0
  assert rewards.math_answer(_sample("so it is 19", answer="Add them: 12+7=19\n#### 19")) == 1.0
  assert rewards.math_answer(_sample("\\boxed{0.25}", answer="\\boxed{\\frac{1}{4}}")) == 1.0
  assert rewards.math_answer(_sample("it is 20", answer=19.0)) == 0.0
  assert rewards.math_answer(_sample("\\boxed{1000001}", answer=1000000)) == 0.0
  assert rewards.math_answer(_sample("The answer is 12345679.", answer=12345678)) == 0.0
  assert rewards.math_answer(_sample("\\boxed{1000001}", answer=1000000.0)) == 0.0
  assert rewards.math_answer(_sample("\\boxed{2x}", answer=2)) == 0.0
  assert rewards.math_answer(_sample("\\boxed{3i}", answer=3)) == 0.0
  assert rewards.math_answer(_sample("\\boxed{5 million}", answer=5)) == 0.0
  assert rewards.math_answer(_sample("\\boxed{5 million}", answer=5_000_000)) == 1.0
  assert rewards.math_answer(_sample("\\boxed{-\\frac{1}{2}}", answer=-0.5)) == 1.0
  assert rewards.math_answer(_sample("\\boxed{\\frac12}", answer=0.5)) == 1.0
  assert rewards.math_answer(_sample("\\boxed{1{,}000}", answer=1000)) == 1.0
  assert rewards.math_answer(_sample("\\boxed{x = 5}", answer=5)) == 1.0
  assert rewards.math_answer(_sample("\\boxed{5}", answer="x = 5")) == 1.0
  assert rewards.math_answer(_sample("So the answer is 42, which is even.", answer=42)) == 1.0
  assert rewards.math_answer(_sample("The answer is 42 because 6*7=42.", answer=42)) == 1.0
  assert rewards.math_answer(_sample("The answer is 3, or maybe 4.", answer=3)) == 0.0
  assert rewards.math_answer(_sample("\\boxed{1/2/3}", answer="3/2")) == 0.0
  with pytest.raises(ValueError, match=r"f.jsonl:3: the reward 'math' needs a reference answer"):
    rewards.math_answer(_sample("7", answer=None))


def test_builtin_exact_regex_length():
  b = rewards.BUILTINS
  assert b["exact"](_sample(" Paris\n", answer="Paris")) == 1.0
  assert b["exact"](_sample("paris", answer="Paris")) == 0.0
  assert b["exact"](_sample("paris", answer="Paris"), ignore_case=True) == 1.0
  fmt = r"<think>.*</think>\s*<answer>.*</answer>"
  assert b["regex"](_sample("<think>a\nb</think> <answer>3</answer>"), pattern=fmt) == 1.0
  assert b["regex"](_sample("<answer>3</answer>"), pattern=fmt) == 0.0
  assert b["regex"](_sample("x <answer>3</answer>"), pattern="<answer>.*</answer>", full=True) == 0.0
  length = lambda n: b["length"](_sample("", ids=range(n)), max_tokens=10, buffer=4)
  assert [length(n) for n in (0, 6, 7, 8, 10, 11)] == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
  path = tmp_path / "my_rewards.py"
  path.write_text(textwrap.dedent("""
      def parts(sample, *, bonus=0.0):
        return {"correct": float(sample.completion == "ok"), "brevity": 0.5, "total": 2.0 + bonus}
      def plain(sample):
        return len(sample.completion)
      def summed(sample):
        return {"a": 1, "b": True}
      def bad_type(sample):
        return "1.0"
      def nan(sample):
        return float("nan")
      def trl_batched(completions, **kwargs):
        return [1.0 for _ in range(40)]
      def boom(sample):
        raise KeyError("no such field")
      def leave(sample):
        raise SystemExit(2)
      async def waits(sample):
        return 1.0
      def yields(sample):
        yield 1.0
      class zreward_class:
        def __call__(self, sample):
          return 1.0
      xscore = zreward_class()
      class zasync_grader:
        async def __call__(self, sample):
          return 1.0
      xwaits = zasync_grader()
      class zyield_grader:
        def __call__(self, sample):
          yield 1.0
      xyields = zyield_grader()
      CONSTANT = 3
  """))
  (tmp_path / "broken_rewards.py").write_text("import os\n\nimport not_installed_pkg\n\ndef f(sample):\n  return 1.0\n")
  (tmp_path / "typo_rewards.py").write_text("def f(sample):\n  return 1.0 +\n")
  monkeypatch.chdir(tmp_path)
  return "my_rewards.py"


def test_scorer_combines_functions_with_weights_and_components(user_module):
  scorer = rewards.Scorer([f"{user_module}:parts", f"{user_module}:plain", "exact"], [1.0, 0.5, 2.0],
                          {"parts": {"bonus": 1.0}})
  assert scorer.names == ("parts", "plain", "exact")
  got = scorer(_sample("ok", answer="ok"))
  assert got.total == pytest.approx(3.0 + 0.5 * 2 + 2.0 * 1.0)
  assert got.components == {"reward/parts/correct": 1.0, "reward/parts/brevity": 0.5, "reward/parts": 3.0,
                            "reward/plain": 2.0, "reward/exact": 1.0}
  summed = rewards.Scorer([f"{user_module}:summed"])(_sample("x"))
  assert summed.total == 2.0 and summed.components["reward/summed/b"] == 1.0


def test_scorer_takes_an_instance_with_call(user_module):
  assert rewards.Scorer([f"{user_module}:xscore"])(_sample("x")).total == 1.0


def test_scorer_loads_by_import_path(user_module, monkeypatch):
  monkeypatch.syspath_prepend(".")
  assert rewards.Scorer(["my_rewards:plain"])(_sample("abc")).total == 3.0


def test_a_reward_file_imports_the_modules_beside_it(tmp_path, monkeypatch):
  """`from my_grading import grade` in a reward file named by path failed at start-up (ModuleNotFoundError)
  unless the run was started from the file's folder with `python -m`: the console script's sys.path has no
  working directory. The file's folder is on sys.path as for a script, also for an import inside a call."""
  monkeypatch.setattr(sys, "path", list(sys.path))
  folder = tmp_path / "rewards_dir"
  folder.mkdir()
  (folder / "beside_grading_7f3.py").write_text("def grade(text):\n  return 0.25 * len(text)\n")
  (folder / "beside_late_7f3.py").write_text("BONUS = 1.5\n")
  (folder / "main.py").write_text("from beside_grading_7f3 import grade\n\n"
                                  "def score(sample):\n"
                                  "  import beside_late_7f3\n"
                                  "  return grade(sample.completion) + beside_late_7f3.BONUS\n")
  monkeypatch.chdir(tmp_path)
  for module in ("beside_grading_7f3", "beside_late_7f3"):
    monkeypatch.delitem(sys.modules, module, raising=False)
  scorer = rewards.Scorer(["rewards_dir/main.py:score"])
  assert scorer(_sample("abcd")).total == 2.5
  assert sys.path[0] == str(folder)


@pytest.mark.parametrize("spec, error, message", [
    ("mth", ValueError, r"Unknown reward 'mth'; expected a built-in \(\['exact', 'length', 'math', 'regex', 'remote'\]\)"),
    ("no_such_pkg.mod:f", ValueError, r"cannot import 'no_such_pkg.mod'.*'path/to/file.py:function'"),
    ("missing.py:f", FileNotFoundError, r"no file '.*missing.py' \(relative paths are read from"),
    ("my_rewards.py:nope", ValueError, r"has no 'nope'; its callables: \['bad_type', 'boom', 'leave', 'nan'"),
    ("my_rewards.py:CONSTANT", ValueError, r"is a int, not a function"),
    # A file that fails to import is one line naming it, the line and the error (it was a raw traceback).
    ("broken_rewards.py:f", ValueError, r"Reward 'broken_rewards.py:f': importing .*broken_rewards.py failed: "
                                        r"line 3: ModuleNotFoundError: No module named 'not_installed_pkg'"),
    ("typo_rewards.py:f", ValueError, r"importing .*typo_rewards.py failed: line 2: SyntaxError"),
    # They return no number: every sample got reward.default, found out in the logs (until 2026-12-05).
    ("my_rewards.py:waits", ValueError, r"^Reward 'my_rewards.py:waits' is an async function \(async def\): a "
                                        r"reward is a plain function called in worker threads .*asyncio.run"),
    ("my_rewards.py:yields", ValueError, r"^Reward 'my_rewards.py:yields' is a generator function \(it yields\)"),
    ("my_rewards.py:zreward_class", ValueError,
     r"^Reward 'my_rewards.py:zreward_class' is a class: calling it makes an instance, not a reward; name a "
     r"function, or an instance"),
    # An instance whose __call__ is async def (or yields) returns no number either (it was accepted).
    ("my_rewards.py:xwaits", ValueError, r"^Reward 'my_rewards.py:xwaits' is an instance whose __call__ is an async "
                                         r"function \(async def\): a reward is a plain function"),
    ("my_rewards.py:xyields", ValueError, r"^Reward 'my_rewards.py:xyields' is an instance whose __call__ is a "
                                          r"generator function \(it yields\)"),
])
def test_scorer_names_bad_functions(user_module, spec, error, message):
  with pytest.raises(error, match=message):
    rewards.Scorer([spec])


def test_scorer_checks_options_weights_and_names(user_module):
  with pytest.raises(ValueError, match=r"cannot be called as fn\(sample, \*\*\{'bonsu': 1\}\)"):
    rewards.Scorer([f"{user_module}:parts"], options={"parts": {"bonsu": 1}})
  # A user's `score` under configs/dataset.py, whose options for `score` are the example's: the error names the key.
  with pytest.raises(ValueError, match=r"fn\(sample, \*\*\{'format_weight': 0.1\}\) \(its options: "
                     r"`reward.options.parts`\): got an unexpected keyword argument 'format_weight'; set "
                     r"`reward.options` to \{\}; on the command line: --config.reward.options=\{\}\.$"):
    rewards.Scorer([f"{user_module}:parts"], options={"parts": {"format_weight": 0.1}})
  with pytest.raises(ValueError, match=r"reward options for \['math'\], which are not among the reward functions' names \['exact'\]"):
    rewards.Scorer(["exact"], options={"math": {}})
  with pytest.raises(ValueError, match=r"2 reward weights \[1.0, 2.0\] for 1 functions"):
    rewards.Scorer(["exact"], [1.0, 2.0])
  with pytest.raises(ValueError, match="share a name"):
    rewards.Scorer(["exact", "exact"])
  # A built-in's options that could score no sample (every call would fail to reward.default) or that are not
  # a dict: named at start-up.
  for name, options, message in [
      ("regex", {"pattern": "<answer>(.*</answer>"}, r"`reward.options.regex` = .*: `pattern` '<answer>\(\.\*</answer>' is not a regular expression \(missing \)"),
      ("length", {"max_tokens": 8, "buffer": 0}, r"`reward.options.length` = .*needs ints 1 <= buffer < max_tokens; got buffer=0"),
      ("length", {"max_tokens": 8, "buffer": 8}, r"got buffer=8, max_tokens=8"),
      ("math", {"rel_tol": -1e-3}, r"`reward.options.math` = .*`rel_tol` must be a finite number >= 0; got -0.001"),
      ("regex", "<answer>.*</answer>", r"`reward.options.regex` must be a dict of keyword options for 'regex'; got"),
  ]:
    with pytest.raises(ValueError, match=message):
      rewards.Scorer([name], options={name: options})
  assert rewards.Scorer(["length"], options={"length": {"max_tokens": 8, "buffer": 2}}).names == ("length",)


@pytest.mark.parametrize("fn, message", [
    ("bad_type", r"reward 'bad_type' returned '1.0' \(str\); expected a number"),
    ("nan", r"reward 'nan' returned nan; rewards must be finite"),
    # A batch reward (TRL's signature) binds to fn(sample) and returns a list: the line says what a reward is.
    ("trl_batched", r"^reward 'trl_batched' returned \[1.0, 1.0, 1.0, 1.0,\.\.\.\.0, 1.0\] \(list\); expected a "
                    r"number or a dict of numbers \(a reward scores one sample, fn\(sample\) -> number, not a batch of "
                    r"completions\)\.$"),
    ("boom", r"no such field"),
])
def test_scorer_bad_returns_raise(user_module, fn, message):
  with pytest.raises(Exception, match=message):
    rewards.Scorer([f"{user_module}:{fn}"])(_sample("x"))


_RETURNS = """
import decimal, fractions
import numpy as np
VALUES = {"fraction": fractions.Fraction(1, 3), "decimal": decimal.Decimal("0.5"), "float32": np.float32(0.25),
          "array0": np.array(2.0), "np_bool": np.bool_(True), "int": 7, "array1": np.array([0.5]),
          "huge": 10 ** 400, "decimal_nan": decimal.Decimal("NaN"), "complex": 1j, "past_float32": -1e39,
          "float32_max": float(np.finfo(np.float32).max)}
def f(sample, *, which):
  return VALUES[which]
"""


def test_scorer_takes_every_real_number_and_names_what_is_none(tmp_path, monkeypatch):
  """A Fraction or Decimal (a maths grader's exact answer) was refused as 'expected a number', defaulting every
  sample; an array of one value or an int past float's range failed with numpy's / Python's own message,
  naming no reward."""
  (tmp_path / "returns.py").write_text(_RETURNS)
  monkeypatch.chdir(tmp_path)
  scored = lambda which: rewards.Scorer(["returns.py:f"], options={"f": {"which": which}})(_sample("x")).total
  got = [scored(w) for w in ("fraction", "decimal", "float32", "array0", "np_bool", "int", "float32_max")]
  assert got == [pytest.approx(1 / 3), 0.5, 0.25, 2.0, 1.0, 7.0, float(np.finfo(np.float32).max)]
  for which, error, message in [
      ("array1", TypeError, r"^reward 'f' returned an array of shape \(1,\); expected a number \(one per sample\) "
                            r"or a dict of numbers\.$"),
      ("huge", ValueError, r"^reward 'f' returned 10000000000000000000\.\.\.00000000 \(int\), which is no float "
                           r"\(int too large to convert to float\)\.$"),
      ("decimal_nan", ValueError, r"^reward 'f' returned Decimal\('NaN'\); rewards must be finite\.$"),
      ("complex", TypeError, r"^reward 'f' returned 1j \(complex\); expected a number"),
      # (finite in float64, it was inf in the float32 batch until 2026-12-06)
      ("past_float32", ValueError, r"^reward 'f' returned -1e\+39, past float32's range \(\|r\| <= 3\.4e38, the "
                                   r"batch's dtype, where it would be inf\)\.$"),
  ]:
    with pytest.raises(error, match=message):
      scored(which)
  with pytest.raises(ValueError, match=r"^the weighted sum of rewards \['f'\] is 6\.8\d*e\+38, past float32's range"):
    rewards.Scorer(["returns.py:f"], weights=[2.0], options={"f": {"which": "float32_max"}})(_sample("x"))


def _drain(runner, n, timeout=10.0):
  out, deadline = [], time.monotonic() + timeout
  while len(out) < n and time.monotonic() < deadline:
    out += runner.poll(wait_s=0.05)
  return {r.key: r for r in out}


@pytest.fixture(name="fresh_process")
def _fresh_process(monkeypatch):
  """The state of a process in which no reward call has failed yet (the traceback is logged once per process,
  and an earlier test of this one may have logged it)."""
  monkeypatch.setattr(_runner, "_TRACEBACK_LOGGED", threading.Lock())


def test_runner_defaults_failures_logs_once_and_counts(user_module, caplog, fresh_process, tmp_path):
  del fresh_process
  scorer = rewards.Scorer([f"{user_module}:boom"])
  runner = rewards.RewardRunner(scorer, workers=2, default=-1.0)
  with caplog.at_level(logging.WARNING, logger="rlax_post.rewards"):
    for k in range(4):
      runner.submit(k, _sample("x"))
    got = _drain(runner, 4)
  runner.close()
  assert sorted(got) == [0, 1, 2, 3] and runner.errors == 4 and runner.pending == 0
  assert all(r.scored.total == -1.0 and r.scored.components == {} for r in got.values())
  # The error names where the user's function raised (a run's one-line stop quotes it: tests/test_run_health.py).
  assert all(r.error == f"KeyError: 'no such field', raised at {tmp_path}/my_rewards.py:15" for r in got.values())
  logged = [r for r in caplog.records if "A reward call failed" in r.getMessage()]
  assert len(logged) == 1 and "Traceback" in logged[0].getMessage() and "f.jsonl:3" in logged[0].getMessage()


def test_runner_logs_one_traceback_per_process_not_per_runner(user_module, caplog, fresh_process):
  """A run builds a runner per producer: a sync run whose reward always raised logged the traceback 4 times
  (docs/data.md: once per process). Each runner still counts its own failures."""
  del fresh_process
  scorer = rewards.Scorer([f"{user_module}:boom"])
  runners = [rewards.RewardRunner(scorer, workers=2, default=-1.0) for _ in range(3)]
  with caplog.at_level(logging.WARNING, logger="rlax_post.rewards"):
    for i, runner in enumerate(runners):
      for k in range(i + 1):
        runner.submit(k, _sample("x"))
      assert len(_drain(runner, i + 1)) == i + 1
      runner.close()
  assert [r.errors for r in runners] == [1, 2, 3]
  assert len([r for r in caplog.records if "A reward call failed" in r.getMessage()]) == 1


def test_runner_defaults_a_reward_that_exits(user_module, tmp_path):
  """sys.exit() in a reward ended its worker thread silently: the call stayed pending for ever, and with
  timeout_s = 0 its group never completed (a helper review). It is a failed call like any other."""
  runner = rewards.RewardRunner(rewards.Scorer([f"{user_module}:leave"]), workers=1, default=-1.0)
  runner.submit("a", _sample("x"))
  runner.submit("b", _sample("y"))  # the same worker goes on
  got = _drain(runner, 2)
  runner.close()
  assert sorted(got) == ["a", "b"] and runner.pending == 0 and runner.errors == 2
  assert got["a"].scored.total == -1.0 and got["a"].error == f"SystemExit: 2, raised at {tmp_path}/my_rewards.py:17"


def test_runner_names_the_users_line_not_the_library_that_raised(user_module, tmp_path):
  """A reward whose library call raised (json's decoder) is named at its own line; a return value that is no
  reward raised in this package, and its message names the function, with no place."""
  (tmp_path / "parsing.py").write_text("import json\n\ndef parse(sample):\n  return json.loads(sample.completion)\n")
  for spec, error in (("parsing.py:parse", "JSONDecodeError: Expecting value: line 1 column 1 (char 0), raised at "
                                           f"{tmp_path}/parsing.py:4"),
                      (f"{user_module}:trl_batched", "TypeError: reward 'trl_batched' returned [1.0, 1.0, 1.0, 1."
                                                     "0,....0, 1.0] (list); expected a number or a dict of numbers "
                                                     "(a reward scores one sample, fn(sample) -> number, not a batch "
                                                     "of completions).")):
    runner = rewards.RewardRunner(rewards.Scorer([spec]), workers=1)
    runner.submit("a", _sample("x"))
    got = _drain(runner, 1)
    runner.close()
    assert got["a"].error == error


def test_runner_times_out_hung_calls_and_keeps_going():
  release = threading.Event()

  def scorer(sample):
    if sample.completion == "hang":
      release.wait(30)
    return rewards.Scored(total=float(len(sample.completion)), components={"reward/len": 1.0})

  runner = rewards.RewardRunner(scorer, workers=1, timeout_s=0.2, default=0.5)
  runner.submit("a", _sample("hang"))
  runner.submit("b", _sample("hang"))
  runner.submit("c", _sample("four"))
  got = _drain(runner, 3)
  release.set()
  runner.close()
  assert sorted(got) == ["a", "b", "c"]
  assert got["a"].scored.total == got["b"].scored.total == 0.5 and "TimeoutError" in got["a"].error
  assert got["c"].scored.total == 4.0 and got["c"].error is None  # A fresh worker replaced each hung one.
  assert runner.errors == 2


def test_runner_without_a_limit_says_once_that_a_call_runs_long(caplog):
  """With reward.timeout_s = 0 a hung reward hung the run and nothing said why (until 2026-12-06)."""
  release = threading.Event()
  runner = rewards.RewardRunner(lambda s: release.wait(30) and rewards.Scored(total=1.0, components={}), workers=2)
  runner.slow_notice_s = 0.05
  with caplog.at_level(logging.WARNING, logger="rlax_post.rewards"):
    runner.submit("a", rewards.Sample(prompt="p", prompt_text="p", completion="x", where="rows.jsonl:7"))
    runner.submit("b", _sample("y"))
    assert runner.poll(wait_s=0.3) == []  # (each poll checks; the notice is once per runner)
    assert runner.poll(wait_s=0.1) == []
    release.set()
    got = _drain(runner, 2)
  runner.close()
  notes = [r.getMessage() for r in caplog.records]
  assert len(notes) == 1 and re.match(r"A reward call has run 0 s for rows\.jsonl:7 and has no time limit "
                                      r"\(reward\.timeout_s = 0\): the run waits for it\.", notes[0]), notes
  assert [got[k].scored.total for k in "ab"] == [1.0, 1.0] and runner.errors == 0


class _RewardServer:
  """A real HTTP reward server on localhost (a thread): answers `answer(request JSON)` as JSON, or the status
  code `fail` with no body; keeps what it received."""

  def __init__(self, answer):
    import http.server  # pylint: disable=g-import-not-at-top
    import json  # pylint: disable=g-import-not-at-top
    received, self.fail = [], None
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_POST(self):  # pylint: disable=invalid-name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        received.append((body, self.headers.get("Authorization")))
        if outer.fail:
          self.send_error(outer.fail)
          return
        text = answer(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

      def log_message(self, *args):  # quiet
        del args

    self.received = received
    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
    threading.Thread(target=self.server.serve_forever, daemon=True).start()

  def close(self):
    self.server.shutdown()
    self.server.server_close()


def test_remote_reward_posts_the_sample_and_reads_a_number_or_named_parts(monkeypatch):
  """The built-in "remote" (OpenRLHF's --remote_rm_url): one POST of the sample's fields per sample; the server's
  answer is a reward function's return (a number, or named parts); errors name the URL. A server on this machine
  is reached directly under an http_proxy that would refuse it (urllib sent localhost to the proxy)."""
  import json  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
  monkeypatch.delenv("no_proxy", raising=False)
  monkeypatch.delenv("NO_PROXY", raising=False)
  answers = {"n": lambda body: json.dumps(len(body["completion"]) / 10), "bad": lambda body: "oops",
             "list": lambda body: "[1]"}
  server = _RewardServer(lambda body: answers.get(body["answer"], lambda b: json.dumps(
      {"format": 0.5, "correct": float(b["completion"] == b["answer"])}))(body))
  try:
    options = {"remote": {"url": server.url, "headers": {"Authorization": "Bearer k"}}}
    scorer = rewards.Scorer(["remote"], options=options)
    assert scorer(_sample("abc", answer="n", ids=(5, 6), row={"id": 7})).total == pytest.approx(0.3)
    body, auth = server.received[0]
    assert body == {"prompt": "p", "prompt_text": "p", "completion": "abc", "completion_ids": [5, 6], "answer": "n",
                    "row": {"id": 7}, "finished": True} and auth == "Bearer k"
    parts = scorer(_sample("x", answer="x"))
    assert parts.total == 1.5 and parts.components == {"reward/remote/format": 0.5, "reward/remote/correct": 1.0,
                                                       "reward/remote": 1.5}
    with pytest.raises(ValueError, match=f"the reward server {server.url} answered 'oops', not JSON"):
      scorer(_sample("x", answer="bad"))
    with pytest.raises(ValueError, match=r"answered '\[1\]'; expected a number or an object of named numbers"):
      scorer(_sample("x", answer="list"))
    server.fail = 503
    with pytest.raises(RuntimeError, match=f"the reward server {server.url} answered HTTP 503 .* for f.jsonl:3"):
      scorer(_sample("x", answer="x"))
  finally:
    server.close()
  with pytest.raises(RuntimeError, match=f"the reward server {server.url} could not be reached"):
    rewards.Scorer(["remote"], options={"remote": {"url": server.url, "timeout_s": 2}})(_sample("x"))
  with pytest.raises(ValueError, match=r"`reward.options.remote` = \{'url': 'ftp://x'\}: `url` must be an http:// or "
                     r"https:// URL of the reward server; got 'ftp://x'\."):
    rewards.Scorer(["remote"], options={"remote": {"url": "ftp://x"}})
  with pytest.raises(ValueError, match="`timeout_s` must be a number of seconds > 0; got 0"):
    rewards.Scorer(["remote"], options={"remote": {"url": "http://h", "timeout_s": 0}})
  with pytest.raises(ValueError, match="missing a required argument: 'url'"):
    rewards.Scorer(["remote"])
