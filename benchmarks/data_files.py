"""The dataset task's file reading: start-up cost and memory of opening a large file, and random row reads.

Writes one file per format (JSON Lines, ArrayRecord, Parquet if pyarrow is installed) of `--rows` rows of
about `--row-bytes` bytes each, then measures, per format: the time to open it (`data.open_rows`: the
index), the peak Python allocation while opening as a fraction of the file's size (the file must not be
read into memory), and the mean time of a row read at random positions (what a ticket costs).

  python benchmarks/data_files.py --rows 1000000 --row-bytes 1000 --json benchmarks/out/data_files.json
"""

import argparse
import json
import os
import tempfile
import time
import tracemalloc

from array_record.python import array_record_module
import numpy as np

from rlax_post import data


def _rows(n: int, row_bytes: int):
  pad = "x" * max(0, row_bytes - 40)
  for i in range(n):
    yield {"prompt": f"Question {i}: {pad}", "answer": i}


def _write(fmt: str, path: str, n: int, row_bytes: int) -> bool:
  if fmt == "jsonl":
    with open(path, "w") as f:
      for row in _rows(n, row_bytes):
        f.write(json.dumps(row) + "\n")
  elif fmt == "arrayrecord":
    writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
    for row in _rows(n, row_bytes):
      writer.write(json.dumps(row).encode())
    writer.close()
  else:
    try:
      import pyarrow as pa  # pylint: disable=g-import-not-at-top  # optional `parquet` extra
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top  # optional `parquet` extra
    except ImportError:
      return False
    rows = list(_rows(n, row_bytes))
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=4096)
  return True


def measure(fmt: str, path: str, reads: int, seed: int) -> dict:
  tracemalloc.start()
  t = time.perf_counter()
  rows = data.open_rows(path)
  open_s = time.perf_counter() - t
  _, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  positions = np.random.default_rng(seed).integers(0, len(rows), reads)
  t = time.perf_counter()
  for i in positions:
    rows[int(i)]
  read_us = (time.perf_counter() - t) / reads * 1e6
  size = os.path.getsize(path)
  return {"format": fmt, "rows": len(rows), "file_mb": size / 2**20, "open_s": open_s,
          "peak_alloc_mb": peak / 2**20, "peak_over_file": peak / size, "read_us": read_us}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=200_000)
  parser.add_argument("--row-bytes", type=int, default=1000)
  parser.add_argument("--reads", type=int, default=2000, help="random row reads timed per format")
  parser.add_argument("--formats", default="jsonl,arrayrecord,parquet")
  parser.add_argument("--dir", default=None, help="where the files go (default: a temporary directory)")
  parser.add_argument("--json", default=None, help="write the results here")
  args = parser.parse_args(argv)
  out = []
  with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
    for fmt in args.formats.split(","):
      path = os.path.join(tmp, f"rows.{fmt}")
      if not _write(fmt, path, args.rows, args.row_bytes):
        print(f"{fmt}: skipped (pyarrow is not installed)")
        continue
      out.append(measure(fmt, path, args.reads, seed=0))
      os.remove(path)
  print(f"{'format':<12} {'rows':>9} {'file MB':>9} {'open s':>8} {'peak MB':>9} {'peak/file':>10} {'read µs':>9}")
  for r in out:
    print(f"{r['format']:<12} {r['rows']:>9} {r['file_mb']:>9.1f} {r['open_s']:>8.3f} {r['peak_alloc_mb']:>9.1f} "
          f"{r['peak_over_file']:>10.3f} {r['read_us']:>9.1f}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"args": vars(args), "results": out}, f, indent=2)


if __name__ == "__main__":
  main()
