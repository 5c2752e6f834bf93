"""The built-in reward "remote": a reward server of the user's, over HTTP (OpenRLHF's `--remote_rm_url`).

Each sample is one POST of a JSON object to the server's URL; the server answers what a reward function returns
(docs/data.md): a JSON number, or an object of named parts (their sum, or its "total"). The dataset task's
reward threads (`reward.workers`) keep several requests in flight while decoding goes on.
"""

from __future__ import annotations

import json
import math
from typing import Any
import urllib.error
import urllib.parse
import urllib.request

_SHOWN = 200  # characters of an answer quoted in an error
_LOOPBACK = ("localhost", "127.0.0.1", "::1")
# A server on this machine is reached directly, whatever http_proxy says (urllib sends even a localhost URL to
# the proxy unless no_proxy names it); other hosts follow the environment's proxy settings.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def request_body(sample) -> bytes:
  """The JSON the server receives: the sample's fields (`rewards.Sample`) but its `where`."""
  return json.dumps({"prompt": sample.prompt, "prompt_text": sample.prompt_text, "completion": sample.completion,
                     "completion_ids": list(sample.completion_ids), "answer": sample.answer, "row": dict(sample.row),
                     "finished": sample.finished}, default=str).encode()


def remote(sample, *, url: str, timeout_s: float = 60.0, headers: dict | None = None) -> Any:
  """The reward the server at `url` answers for `sample` (a POST of `request_body`, `Content-Type:
  application/json` and `headers`; a loopback host directly, others through the environment's proxy): a
  number, or an object of named parts. An HTTP error, no answer within
  `timeout_s` seconds or an answer that is neither raises, naming the URL: the sample gets `reward.default`,
  counted in `reward_errors`."""
  request = urllib.request.Request(url, data=request_body(sample), method="POST",
                                   headers={"Content-Type": "application/json", **dict(headers or {})})
  opener = _DIRECT if urllib.parse.urlparse(url).hostname in _LOOPBACK else urllib.request.build_opener()
  try:
    with opener.open(request, timeout=timeout_s) as response:
      text = response.read().decode("utf-8", errors="replace")
  except urllib.error.HTTPError as e:
    raise RuntimeError(f"the reward server {url} answered HTTP {e.code} ({e.reason}) for {sample.where or 'a sample'}"
                       ) from None
  except (urllib.error.URLError, OSError) as e:
    reason = getattr(e, "reason", e)
    raise RuntimeError(f"the reward server {url} could not be reached or did not answer within {timeout_s} s "
                       f"({reason})") from None
  try:
    value = json.loads(text)
  except ValueError:
    raise ValueError(f"the reward server {url} answered {text[:_SHOWN]!r}, not JSON; expected a number or an "
                     "object of named numbers") from None
  if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
    raise ValueError(f"the reward server {url} answered {text[:_SHOWN]!r}; expected a number or an object of named "
                     "numbers")
  return value


def check_options(url: Any = None, timeout_s: Any = 60.0, headers: Any = None, **unused) -> None:
  """Raises ValueError when `remote`'s options could not score a sample."""
  del unused
  parsed = urllib.parse.urlparse(url) if isinstance(url, str) else None
  if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
    raise ValueError(f"`url` must be an http:// or https:// URL of the reward server; got {url!r}")
  if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
      timeout_s > 0 and math.isfinite(timeout_s)):
    raise ValueError(f"`timeout_s` must be a number of seconds > 0; got {timeout_s!r}")
  if headers is not None and not (isinstance(headers, dict) and all(
      isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
    raise ValueError(f"`headers` must be a dict of strings; got {headers!r}")
