"""Child process for the checkpoint kill and file-size-limit tests (not a test module).

``python ckpt_writer_child.py loop DIR N_FLOAT32``
    Resume like the engine does (clean temp files, load the latest checkpoint) and
    save rounds latest+1, latest+2, ... forever, printing ``ready`` once and
    ``saved <round>`` after each save returns. The parent SIGKILLs it.
``python ckpt_writer_child.py fsize DIR N_FLOAT32 LIMIT_BYTES``
    Save round 1 small, then cap the file size with RLIMIT_FSIZE and save round 2
    with N_FLOAT32 values, so the kernel fails the write with EFBIG the way a full
    disk fails it with ENOSPC. Prints ``error: <message>`` or ``no error``.
"""

import resource
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcfl.errors import HpcflError  # noqa: E402
from hpcfl.io.checkpoint import CheckpointStore  # noqa: E402

MANIFEST = {"world_size": 4, "config_sha256": "ab" * 32, "versions": {"hpcfl": "test"}}


def arrays_for(round: int, n: int) -> dict:
    """Content that depends on the round, so the parent can check a loaded checkpoint independently of its SHA."""
    return {
        "model": np.arange(n, dtype=np.float32) + np.float32(round),
        "server_momentum": np.full((3, 5), round, dtype=np.float64),
        "rng_state": np.array([round, 7, 11], dtype=np.uint64),
        "round_scalar": np.array(round, dtype=np.int64),
    }


def main(argv):
    mode, directory, n = argv[0], Path(argv[1]), int(argv[2])
    store = CheckpointStore(directory, keep=2)
    if mode == "loop":
        store.clean_temp()
        latest = store.load_latest()
        r = latest.round if latest else 0
        print("ready", flush=True)
        while True:
            r += 1
            store.save(r, arrays_for(r, n), meta={"clock": r * 1.5}, manifest=MANIFEST)
            print(f"saved {r}", flush=True)
    elif mode == "fsize":
        store.save(1, arrays_for(1, 10), meta={}, manifest=MANIFEST)
        limit = int(argv[3])
        # Without ignoring SIGXFSZ the kernel kills the process instead of failing write().
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        try:
            store.save(2, arrays_for(2, n), meta={}, manifest=MANIFEST)
            print("no error", flush=True)
        except HpcflError as e:
            print(f"error: {e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
