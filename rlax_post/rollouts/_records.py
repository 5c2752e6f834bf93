"""Field validation and the on-disk record format of one put.

A record is one `put(row_id, fields, group_id=..., group_size=...)` call, serialised with flax msgpack as

    {"version": 1, "row_id": str, "group_id": str, "group_size": int, "fields": {name: value}}

`flax.serialization.msgpack_serialize` stores numpy arrays and numpy scalars as an extension type carrying
dtype, shape and the raw buffer, so field values round-trip with their exact dtype and shape; python
`bool`/`int`/`float`/`str`/`bytes`/`None` round-trip as themselves. Other values (lists, dicts, object arrays)
are rejected at `put` time in both backends, so the memory and file backends accept exactly the same input.

A shard (one file of the file queue) is `SHARD_MAGIC`, the shard's publish stamp (little-endian uint64: its
writer's clock at publish, in ns, kept increasing per writer and above every stamp the writer has read; readers
merge shards in stamp order, so a reopened queue hands groups out in the order they were published), then one
frame per record: its byte length and its CRC-32 (two little-endian uint32), then the bytes; then a trailer: the
record count (uint32) and `SHARD_END`. The file costs 28 bytes plus 8 per record over its payload. The trailer
makes a shard whose tail frames a storage lost (cut at a frame boundary) an error rather than a shorter valid
shard, whose groups would never complete. Shards of the earlier formats (`SHARD_MAGIC_V2`: no stamp;
`SHARD_MAGIC_V1`: no stamp, no trailer) are still read, with no stamp. (Shards used
to be ArrayRecord files, which pad their footer and postscript to 64 KiB riegeli blocks whatever the options,
so every shard took at least 128 KiB; readers still read those too.)
"""

from collections.abc import Mapping, Sequence
import struct
import typing
from typing import Any
import zlib

from flax import serialization
import numpy as np

RECORD_VERSION = 1
SHARD_MAGIC = b"RLAXQS03"
SHARD_MAGIC_V2 = b"RLAXQS02"  # no stamp (read, never written)
SHARD_MAGIC_V1 = b"RLAXQS01"  # frames only, no stamp, no trailer (read, never written)
SHARD_END = b"RLAXQEND"
_FRAME = struct.Struct("<II")  # record length, CRC-32 of the record
_TRAILER = struct.Struct("<I8s")  # record count, SHARD_END
_STAMP = struct.Struct("<Q")  # the publish stamp, after SHARD_MAGIC
_PY_SCALARS = (bool, int, float, str, bytes, type(None))


class PutRecord(typing.NamedTuple):
  """One decoded put."""
  row_id: str
  group_id: str
  group_size: int
  fields: dict[str, Any]  # name -> numpy array / numpy scalar / python scalar / str / bytes / None


def normalise_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
  """Validates field names and values; returns a private copy (arrays copied: callers may reuse buffers).

  Args:
    fields: name -> value; values are numpy arrays (any non-object dtype and shape), numpy scalars, python
      `bool`/`int`/`float`/`str`/`bytes`/`None`, or array-likes with `__array__` (e.g. `jax.Array`, converted
      to numpy).

  Returns:
    A new dict with the same names and numpy-or-python values.

  Raises:
    ValueError: a name is not a non-empty str or a value has an unsupported type or dtype.
  """
  if not isinstance(fields, Mapping):
    raise ValueError(f"fields must be a mapping of name -> value; got {type(fields).__name__}")
  out = {}
  for name, value in fields.items():
    if not isinstance(name, str) or not name:
      raise ValueError(f"field names must be non-empty str; got {name!r}")
    if isinstance(value, np.generic):
      pass
    elif isinstance(value, _PY_SCALARS):
      pass
    elif isinstance(value, np.ndarray) or hasattr(value, "__array__"):
      value = np.array(value, copy=True)
    else:
      raise ValueError(f"field {name!r}: unsupported value type {type(value).__name__}; use a numpy array, a "
                       "numpy scalar, or a python bool/int/float/str/bytes/None")
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind not in "biufcSUV":
      raise ValueError(f"field {name!r}: unsupported dtype {value.dtype}")
    out[name] = value
  return out


def encode_put(record: PutRecord) -> bytes:
  """Serialises a put (fields already normalised) to msgpack bytes."""
  return serialization.msgpack_serialize({
      "version": RECORD_VERSION,
      "row_id": record.row_id,
      "group_id": record.group_id,
      "group_size": record.group_size,
      "fields": dict(record.fields),
  })


def decode_put(data: bytes) -> PutRecord:
  """Inverse of `encode_put`; raises ValueError for an unknown record version."""
  obj = serialization.msgpack_restore(data)
  version = obj.get("version")
  if version != RECORD_VERSION:
    raise ValueError(f"unknown rollout record version {version!r}; expected {RECORD_VERSION}")
  return PutRecord(row_id=obj["row_id"], group_id=obj["group_id"], group_size=int(obj["group_size"]),
                   fields=dict(obj["fields"]))


def encode_shard(records: Sequence[bytes], *, stamp: int) -> bytes:
  """The bytes of a shard file holding `records`, published at `stamp` (see the module docs)."""
  if isinstance(stamp, bool) or not isinstance(stamp, int) or not 0 <= stamp < 2**64:
    raise ValueError(f"stamp must be an int in [0, 2**64); got {stamp!r}")
  parts = [SHARD_MAGIC, _STAMP.pack(stamp)]
  for record in records:
    parts += [_FRAME.pack(len(record), zlib.crc32(record)), record]
  parts.append(_TRAILER.pack(len(records), SHARD_END))
  return b"".join(parts)


def shard_stamp(data: bytes) -> int | None:
  """The publish stamp of a shard's bytes; None for a shard of an earlier format (no stamp)."""
  if data[:len(SHARD_MAGIC)] != SHARD_MAGIC or len(data) < len(SHARD_MAGIC) + _STAMP.size:
    return None
  return _STAMP.unpack_from(data, len(SHARD_MAGIC))[0]


def decode_shard(data: bytes) -> list[bytes]:
  """The records of a shard (inverse of `encode_shard`; `shard_stamp` reads its stamp); raises ValueError for a
  foreign, truncated or corrupt file (a published shard is written whole before its rename, so this means the
  storage damaged it)."""
  magic = data[:len(SHARD_MAGIC)]
  if magic == SHARD_MAGIC_V1:
    return _frames(data, len(SHARD_MAGIC), len(data))
  if magic not in (SHARD_MAGIC, SHARD_MAGIC_V2):
    raise ValueError(f"not a rollout shard: it starts with {magic!r}, not {SHARD_MAGIC!r}")
  start = len(SHARD_MAGIC) + (_STAMP.size if magic == SHARD_MAGIC else 0)
  end = len(data) - _TRAILER.size
  if end < start:
    raise ValueError(f"truncated shard: {len(data)} bytes, shorter than its header and trailer")
  count, marker = _TRAILER.unpack_from(data, end)
  if marker != SHARD_END:
    raise ValueError(f"truncated shard: it ends with {data[-8:]!r}, not its trailer {SHARD_END!r} (its last "
                     f"frames were lost)")
  records = _frames(data, start, end)
  if len(records) != count:
    raise ValueError(f"shard holds {len(records)} records; its trailer says {count}")
  return records


def _frames(data: bytes, start: int, end: int) -> list[bytes]:
  """The records framed in data[start:end]."""
  records, pos = [], start
  while pos < end:
    if pos + _FRAME.size > end:
      raise ValueError(f"truncated frame header at byte {pos} of {end}")
    size, crc = _FRAME.unpack_from(data, pos)
    pos += _FRAME.size
    record = data[pos:min(pos + size, end)]
    if len(record) != size or zlib.crc32(record) != crc:
      raise ValueError(f"record at byte {pos}: {len(record)} of {size} bytes, checksum "
                       f"{'ok' if zlib.crc32(record) == crc else 'mismatch'}")
    records.append(record)
    pos += size
  return records
