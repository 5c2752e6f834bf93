"""Final-answer matching for maths completions: find the answer, read it as a number, compare.

`extract_answer(text)` takes, in this order of preference, the last of:
  1. `\\boxed{...}` / `\\fbox{...}` (braces balanced: `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`);
  2. `#### ...` (GSM8K), up to the end of its line (a stated answer there as in 3: `#### The answer is 42`);
  3. "the answer is ..." / "answer: ..." (any case), up to the end of the sentence or line, or, when that
     is no number but starts with one, up to the end of that number and its units ("the answer is 42,
     which is even" gives "42"; "Final Answer: The final answer is 42. I hope it is correct." gives "42");
  4. the last number in the text.
`parse_number(s)` reads integers, decimals, fractions (`3/4`, not `1/2/3`, `\\frac{3}{4}`, `\\dfrac`,
`\\tfrac`, `\\frac12`), mixed numbers (`2 1/2`, `2\\frac{1}{2}`), scientific notation (`3 \\times 10^{5}`,
`2 × 10^6`; with a unit after it, `3.0 \\times 10^8 m/s`), signs (also the Unicode minus, and before
`\\frac`), thousands separators (`1,234,567` or `1{,}234{,}567`: groups of exactly three digits), a leading `$`
or `\\$` or single-letter variable and `=` (`x = 5`), a trailing `%`, degrees (`90^\\circ`, `90°`) or unit
words (after whitespace, two letters or more: `72 dollars`, `5\\text{ cm}`; not `2x`, `3i`, `2 x`, nor words
of arithmetic such as `squared` or `pi`), a scale word first among them, which multiplies (`5 million` reads
5000000; a scale word elsewhere or in the plural reads no number), a rate's unit after a number's unit (`5 m/s`),
LaTeX spacing, math delimiters (`\\(42\\)`), `\\text{}`, Markdown
bold (`**42**`) and quotes around the whole (`"42"`, `"Paris."`); the value written becomes a
`Fraction` (decimals too; a float only with an exponent; more than 4300 digits, beyond what Python reads, are no
number). Two answers match when both read as numbers that agree, or, when either does not read as a number, when their
normalised texts are equal (`_normalise_text`: `(B)` is `B`, `\\sqrt2` is `\\sqrt{2}`). Numbers agree when they are
equal, or when either is an approximation and |a - b| < max(rel_tol * max(|a|, |b|), abs_tol), computed exactly
(the tolerances read as the decimals they print as). Integers and fractions of them are exact, and so is any whole
number however written (`12.0`, `1e6`, a float reference `1000000.0`): `1000001` never matches `1000000`; but not
an exponent's float that is not the decimal it prints as (`6.02e23` reads as the float 6.02e23 less 4194304), an
approximation (it matches `6.02 \\times 10^{23}`). A decimal that is not whole (`0.1`,
`3.14159`, a float reference `0.6666666666666666`) is an approximation: `0.3333333` matches `1/3`, while `0.333333`
(off by exactly one part in 10^6) does not at the default rel_tol=1e-6.
"""

from __future__ import annotations

from fractions import Fraction
import math
import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")
_HASHES = re.compile(r"####\s*([^\n]*)")
# A phrase may open with "Final Answer:" before another: "Final Answer: The final answer is 42. I hope it is
# correct." (the Minerva / lm-eval MATH format) states "42", not "The final answer is 42".
_ANSWER_IS = re.compile(r"(?:(?:final\s+)?answer\s*:[\s*]*)?"
                        r"(?:the\s+(?:final\s+)?answer\s+is|final\s+answer\s*:|answer\s*:)\s*:?\s*(.+?)"
                        r"(?:\.(?:\s|$)|\n|$)", re.IGNORECASE)
# A number: thousands-grouped or plain digits, optional decimals, optional /denominator; not preceded by
# a letter, digit or dot (so "x2" or "5-3" give no "2" / "-3"). A leading ".5" also counts.
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?(?![\d])"
                     r"|(?<![\w.])[-+]?\.\d+")
# A LaTeX fraction with an optional sign before it; each part braced or a single digit (`\\frac12`).
_FRAC = re.compile(r"([-+]?)\s*\\[dt]?frac\s*(?:\{\s*([^{}]+?)\s*\}|(\d))\s*(?:\{\s*([^{}]+?)\s*\}|(\d))")
# A mixed number: a whole number and a proper fraction ("2 1/2", "2\\frac{1}{2}"), read as their sum.
_MIXED = re.compile(r"([-+]?)(\d+)(?:\s+(\d+)\s*/\s*(\d+)|\s*\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\})")
# Scientific notation as LaTeX or text writes it: "3 \\times 10^{5}", "1.5\\cdot10^{-3}", "2 × 10^6".
_SCIENTIFIC = re.compile(r"(.+?)\s*(?:\\times|\\cdot|×)\s*10\s*\^\s*(?:\{\s*([-+]?\d{1,4})\s*\}|(\d))")
# ... then a unit, which starts with a letter: "3.0 \\times 10^8 m/s", "2 × 10^6 dollars".
_SCIENTIFIC_UNIT = re.compile(_SCIENTIFIC.pattern + r"(\s*[A-Za-z].*)")
# A rate's unit after a number's own ("5 m/s", "9.8 m/s^2", "60 km/h"): letters, maybe a power.
_PER_UNIT = re.compile(r"[A-Za-z]+(?:\^\{?\d\}?)?")
_QUOTES = ('"', "'", "`", "\u201c\u201d", "\u2018\u2019")  # an answer quoted whole: "\"Paris\"", "\u201cParis\u201d"
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")
# Words after a number: a scale word multiplies it; a word of arithmetic or of doubt is no unit, nor does a
# stated answer end before it ("the answer is 5 and 7", "3, or maybe 4" are not 5 and 3).
_SCALES = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_NOT_UNITS = frozenset({"and", "or", "plus", "minus", "times", "over", "divided", "squared", "cubed", "pi", "sqrt",
                        "root", "not", "but", "maybe", "perhaps", "possibly", "otherwise", "else"})
# Where a stated answer may end before its sentence does: a space, or a comma, semicolon or colon and a space,
# then a word, or a bracket and a word ("42, which is even", "42 because 6*7=42", "42 (six times seven)"); looked
# for only in its first characters, since a number and its units are short (and so a long run of spaces costs
# nothing).
_CLAUSE = re.compile(r"[,;:]?\s+\(?([A-Za-z]+)")
_STATED_NUMBER_CHARS = 100
_VARIABLE = re.compile(r"(?:[A-Za-z]\s*=(?!=)\s*)?")  # "x = 5": one letter, so not "f(x) = 5" or "xy = 5"
_PLAIN = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")


def _last_boxed(text: str) -> str | None:
  """The stripped contents of the last `\\boxed{` / `\\fbox{` (by where it opens) whose brace closes and
  that is not blank, or None.

  One pass with a stack of open braces: a box's closing brace depends only on the text after it, so this
  pairs braces exactly as scanning forward from each box would, in linear rather than quadratic time (a
  model repeating `\\boxed{` thousands of times made the scan-per-box take minutes). Spans, not copies, are
  kept until one is chosen, so deeply nested boxes cost no more.
  """
  box_starts = {m.end() for m in _BOXED.finditer(text)}  # the index just after each box's "{"
  spans, open_at = [], []
  for brace in _BRACE.finditer(text):
    if brace.group() == "{":
      open_at.append(brace.end())
    elif open_at:
      start = open_at.pop()
      if start in box_starts:
        spans.append((start, brace.start()))
  for start, end in sorted(spans, reverse=True):
    content = text[start:end].strip()
    if content:
      return content
  return None


def extract_answer(text: str) -> str | None:
  """The final answer written in `text` (module docstring), or None when it has none."""
  if not isinstance(text, str):
    raise ValueError(f"text must be a str; got {type(text).__name__}.")
  text = _latex_plain(text)
  boxed = _last_boxed(text)
  if boxed is not None:
    return boxed
  hashes = [h.strip() for h in _HASHES.findall(text) if h.strip()]
  if hashes:  # ("#### The answer is 42" states 42)
    stated = _ANSWER_IS.findall(hashes[-1]) if _read(hashes[-1]) is None else []
    return _stated(stated[-1].strip()) if stated and stated[-1].strip() else hashes[-1]
  stated = [s.strip() for s in _ANSWER_IS.findall(text) if s.strip()]
  if stated:
    return _stated(stated[-1])
  numbers = _NUMBER.findall(text)
  return numbers[-1].strip() if numbers else None


def _stated(s: str) -> str:
  """A stated answer, which runs to the end of its sentence: all of it when it reads as a number or has no
  number at its start, else its shortest beginning that reads as a number and ends before a clause ("42, which
  is even", "42 because 6*7=42" and "42 (six times seven)" give "42"; "5 million, so" gives "5 million")."""
  if _read(s) is not None:
    return s
  for clause in _CLAUSE.finditer(s, 0, _STATED_NUMBER_CHARS):
    word = clause.group(1).lower()
    if len(word) < 2 or word in _NOT_UNITS or word.rstrip("s") in _SCALES:
      continue
    head = s[:clause.start()].strip()
    if _read(head) is not None:
      return head
  return s


def _latex_plain(s: str) -> str:
  """The Unicode minus as `-`, and LaTeX's thousands separator `{,}` (`1{,}000`) as a plain comma."""
  return s.replace("\u2212", "-").replace("{,}", ",")


def _clean(s: str) -> str:
  s = _latex_plain(s).strip()
  s = _TEXT.sub(r" \1", s)  # a space, so `5\\text{cm}` keeps its unit apart like `5 cm`
  for token in ("\\$", "$", "\\(", "\\)", "\\[", "\\]", "\\displaystyle", "\\!", "\\,", "\\;", "\\ ", "\\left",
                "\\right", "\\%", "^{\\circ}", "^\\circ", "\u00b0"):  # degrees: MATH writes `90^\\circ`
    s = s.replace(token, "")
  s = s.strip().strip("*").strip()  # Markdown bold around an answer: "The answer is **42**", "**Answer:** 42"
  s = s.rstrip(".").strip()
  for q in _QUOTES:
    if len(s) >= 2 and s[0] == q[0] and s[-1] == q[-1]:
      return _clean(s[1:-1])  # (what the quotes hold, cleaned too: a period inside them, "Paris.")
  return s


# Unit symbols read after a number, spaced or not ("3 m", "5g", "5cm", "12 s"); a letter outside them ("2x",
# "3i", "2 e") is a variable, not a unit.
_UNIT_SYMBOLS = frozenset({"m", "g", "s", "h", "l", "L", "V", "W", "J", "N", "K", "A", "C", "T", "Hz", "cm", "mm",
                           "km", "kg", "mg", "ml", "mL", "min", "hr", "hrs", "ms", "ft", "lb", "lbs", "oz", "mi",
                           "yd", "GB", "MB", "kB", "KB"})


def _unit_scale(rest: str) -> int | None:
  """What the text after a number multiplies it by: 1 for nothing, `%` or unit words ("72 dollars"), the
  scale word's value for a leading scale word ("5 million", "2 thousand dollars"), 1 for a unit symbol spaced
  or not ("3 m", "5cm"); None when the text is not a unit: other letters written against the number ("2x",
  "3i"), another one-letter word ("2 x"), a word of arithmetic
  ("5 squared", "3 and 4"), or a scale word elsewhere ("5 dollars million", "5 millions")."""
  if not rest.strip() or rest.strip() == "%" or rest.strip() in _UNIT_SYMBOLS:
    return 1
  if not re.fullmatch(r"\s+[A-Za-z]{2,}(?:\s+[A-Za-z]{2,})*\s*", rest):
    return None
  words = rest.lower().split()
  scale = _SCALES.get(words[0], 1)
  later = words[1:] if scale != 1 else words
  if any(w in _NOT_UNITS or w.rstrip("s") in _SCALES for w in later):
    return None
  return scale


def _ratio(num, den):
  """`num / den` for two `_parse` results: exact when both parts are exact."""
  if num is None or den is None or den[0] == 0:
    return None
  (a, a_exact), (b, b_exact) = num, den
  if isinstance(a, Fraction) and isinstance(b, Fraction):
    return a / b, a_exact and b_exact
  try:
    value = float(a) / float(b)
  except OverflowError:  # a part too large for a float ("1e3/" and 400 nines)
    return None
  return (value, False) if math.isfinite(value) else None


def _power(scientific: re.Match) -> Fraction:
  """The power of ten of a `_SCIENTIFIC` match."""
  return Fraction(10) ** int(scientific.group(2) or scientific.group(3))


def _unit_after(rest: str) -> int | None:
  """What a unit after a number multiplies it by (`_unit_scale`), a rate's unit too (a unit, "/" and a unit:
  "m/s", "km/h"); None when `rest` is no unit."""
  unit, slash, per = rest.partition("/")
  if slash and not (unit.strip() and _PER_UNIT.fullmatch(per.strip())):
    return None
  return _unit_scale(unit)


def _with_unit(s: str) -> tuple[Fraction | float, bool] | None:
  """`_parse` of scientific notation with a unit after it ("3.0 \\times 10^8 m/s" reads 3e8, "2 × 10^6 dollars"
  2e6; no number until 2026-12-06); None when `s` is not written so, or its parts read as no number and unit."""
  scientific = _SCIENTIFIC_UNIT.fullmatch(s)
  scale = None if scientific is None else _unit_after(scientific.group(4))
  mantissa = None if scale is None else _parse(scientific.group(1))
  if mantissa is None:
    return None
  return Fraction(mantissa[0]) * _power(scientific) * scale, mantissa[1]


def _parse(s: str) -> tuple[Fraction | float, bool] | None:
  """`parse_number(s)` and whether it is written exactly: without a decimal point or exponent."""
  s = _clean(s)
  frac = _FRAC.fullmatch(s)
  if frac:
    sign, num, den = frac.group(1), frac.group(2) or frac.group(3), frac.group(4) or frac.group(5)
    ratio = _ratio(_parse(num), _parse(den))
    return (-ratio[0], ratio[1]) if ratio is not None and sign == "-" else ratio
  mixed = _MIXED.fullmatch(s)
  if mixed:
    sign, whole = mixed.group(1), int(mixed.group(2))
    num, den = int(mixed.group(3) or mixed.group(5)), int(mixed.group(4) or mixed.group(6))
    if not 0 < num < den:  # ("2 3/2", "2 0/3": no mixed number a person writes)
      return None
    return Fraction(-1 if sign == "-" else 1) * (whole + Fraction(num, den)), True
  scientific = _SCIENTIFIC.fullmatch(s)
  if scientific:
    mantissa = _parse(scientific.group(1))
    return None if mantissa is None else (Fraction(mantissa[0]) * _power(scientific), mantissa[1])
  united = _with_unit(s)
  if united is not None:
    return united
  if "/" in s:
    num, _, den = s.partition("/")
    head = _PLAIN.match(num.strip())
    if _PER_UNIT.fullmatch(den.strip()) and head and num.strip()[head.end():].strip():  # "5 m/s": 5, not 5/s
      return _parse(num)
    if not num.strip() or not den.strip() or "/" in den:  # "1/2/3": neither (1/2)/3 nor 1/(2/3) is sure
      return None
    return _ratio(_parse(num), _parse(den))
  m = _PLAIN.match(s)
  if not m:
    return None
  scale = _unit_scale(s[m.end():])
  if scale is None:
    return None
  token = m.group(0).replace(",", "")
  if "e" in token.lower():
    value = float(token) * scale
    return (value, False) if math.isfinite(value) else None
  try:
    value = Fraction(token)
  except ValueError:  # more digits than Python reads (4300: a model repeating "3" until its token budget)
    return None
  return value * scale, "." not in token


def _read(s: str) -> tuple[Fraction | float, bool] | None:
  """`_parse` of a whole answer, less a leading single-letter variable and `=` (`x = 5` reads 5)."""
  s = _clean(s)
  return _parse(s[_VARIABLE.match(s).end():])


def parse_number(s: str) -> Fraction | float | None:
  """The number `s` writes (module docstring): a `Fraction` of it, a float with an exponent; None if `s`
  is not a number (a trailing unit word or `%` is allowed: "72 dollars" reads 72, "5 million" 5000000)."""
  if not isinstance(s, str):
    raise ValueError(f"s must be a str; got {type(s).__name__}.")
  parsed = _read(s)
  return None if parsed is None else parsed[0]


def _normalise_text(s: str) -> str:
  """An answer that is no number, as compared: spaces dropped, lower case, `\\sqrt2` as `\\sqrt{2}`, `\\dfrac` /
  `\\tfrac` as `\\frac`, a choice letter without its brackets (`(B)` as `B`)."""
  s = re.sub(r"\s+", "", _clean(s)).lower()
  s = re.sub(r"\\[dt]frac", r"\\frac", re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s))
  return re.sub(r"^\(([a-z])\)$", r"\1", s)


def reference_answer(answer) -> str | None:
  """A row's reference answer as text: numbers as written, strings with a `####` or `\\boxed{}` read through
  `extract_answer`, other strings as they are; None when there is no usable answer."""
  if answer is None or isinstance(answer, bool):
    return None
  if isinstance(answer, (int, float)):
    return repr(answer) if isinstance(answer, float) else str(answer)
  if isinstance(answer, str):
    if "####" in answer or _BOXED.search(answer):
      return extract_answer(answer)
    return answer.strip() or None
  return None


def _tolerance(name: str, value) -> Fraction:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
    raise ValueError(f"{name} must be a finite number >= 0; got {value!r}.")
  return Fraction(repr(float(value)))  # the decimal it prints as: rel_tol=1e-6 is exactly 10^-6


def _whole(x: Fraction, exact: bool, read: Fraction | float) -> bool:
  """Whether a `_parse` result (`read`, `exact`; `x` its Fraction) is exact by being whole (`_numbers_match`)."""
  return exact or (x.denominator == 1 and not (isinstance(read, float) and Fraction(repr(read)) != x))


def _numbers_match(a, b, rel_tol: Fraction, abs_tol: Fraction) -> bool:
  """Two `_parse` results agree (module docstring): exactly when both are exact, else within a tolerance."""
  (x, x_exact), (y, y_exact) = (Fraction(a[0]), a[1]), (Fraction(b[0]), b[1])
  if x == y:
    return True
  # A whole number is exact however it is written ("12.0", a float reference 1000000.0): a tolerance
  # there would only let a different integer through. Not a float off the decimal it prints as ("6.02e23").
  if _whole(x, x_exact, a[0]) and _whole(y, y_exact, b[0]):
    return False
  diff = abs(x - y)  # exact arithmetic, so no float rounding decides a case near the boundary
  return diff < rel_tol * max(abs(x), abs(y)) or diff < abs_tol


def answers_match(predicted: str | None, reference: str | None, *, rel_tol: float = 1e-6,
                  abs_tol: float = 1e-9) -> bool:
  """Whether two answers agree (module docstring); `rel_tol` and `abs_tol` must be finite and >= 0."""
  rel, abs_ = _tolerance("rel_tol", rel_tol), _tolerance("abs_tol", abs_tol)
  if predicted is None or reference is None:
    return False
  a, b = _read(predicted), _read(reference)
  if a is not None and b is not None:
    return _numbers_match(a, b, rel, abs_)
  return _normalise_text(predicted) == _normalise_text(reference)


def math_answer(sample, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> float:
  """1.0 when the completion's final answer matches the row's reference answer, else 0.0 (the built-in
  reward "math"; `sample` is a `rewards.Sample`)."""
  reference = reference_answer(sample.answer)
  if reference is None:
    raise ValueError(f"{sample.where}: the reward 'math' needs a reference answer (a number or a string); the "
                     f"row's answer is {sample.answer!r}.")
  return float(answers_match(extract_answer(sample.completion), reference, rel_tol=rel_tol, abs_tol=abs_tol))
