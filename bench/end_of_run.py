"""End-of-run cost of results.h5: time and bytes written by the final write of a file of a given size.

Builds a results.h5 of about ``--gb`` GB (uncompressed /clients rows of a 1,000-client cohort, written in
large batches), then times ``write_final`` + ``close`` and counts the bytes this process wrote meanwhile
(/proc/self/io wchar) and the file's inode before and after. Works with the hpcfl on PYTHONPATH, before
(schema 2: a copy renamed over the file) and after (schema 3: in place)::

    PYTHONPATH=/path/to/hpcfl python bench/end_of_run.py --gb 1 --dir /tmp/bench-end
"""

from __future__ import annotations

import argparse
import inspect
import shutil
import time
from pathlib import Path

import numpy as np

import hpcfl
from hpcfl.io import results
from hpcfl.io.schema import CLIENT_FIELDS, METRICS


def wchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar")).split()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--dir", default="/tmp/bench-end")
    ap.add_argument("--clients", type=int, default=1000)
    a = ap.parse_args()
    out = Path(a.dir)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    path = out / "results.h5"
    names, shapes, params = ["param:w"], [(1000,)], np.arange(1000, dtype=np.float32)
    new_api = "model" in inspect.signature(results.ResultsWriter).parameters
    kw = {"model": results.FinalModel(names, shapes, "float32")} if new_api else {}
    w = results.ResultsWriter(path, {"config": {"run": {"rounds": 1}}, "seed": 0}, np.ones((a.clients, 3), np.int64),
                              batch_rows=1 << 40, batch_seconds=1e9, **kw)
    per_round = a.clients * 73
    rounds = int(a.gb * 1e9 / per_round)
    ids = np.arange(a.clients)
    c = {k: np.zeros(a.clients, dtype=f.dtype) for k, f in CLIENT_FIELDS.items()}
    c["client"] = ids
    t = time.perf_counter()
    for r in range(1, rounds + 1):
        m = {k: 0.0 for k in METRICS}
        m["round"] = r
        w.append_round(m, {**c, "round": np.full(a.clients, r)})
        if r % 500 == 0:
            w.write_pending()
    w.sync()
    build = time.perf_counter() - t
    size, inode = path.stat().st_size, path.stat().st_ino
    before, t = wchar(), time.perf_counter()
    if new_api:
        w.write_final(params)
    else:
        w.write_final(params, names, shapes)
    w.close()
    elapsed, written = time.perf_counter() - t, wchar() - before
    print(f"hpcfl {Path(hpcfl.__file__).parent.parent}: results.h5 {size / 1e9:.3f} GB ({rounds} rounds of "
          f"{a.clients} clients, built in {build:.1f} s)")
    print(f"  end of run: {elapsed:.3f} s, {written:,} bytes written, same inode: {path.stat().st_ino == inode}, "
          f"files: {sorted(p.name for p in out.iterdir())}")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
