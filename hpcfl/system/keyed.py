"""Counter-based uniforms that are a pure function of their key.

``KeyedUniform(seed, stream).draw(clients, rnd)`` returns, for every client, numbers that
depend only on ``(seed, stream, rnd, client, j)``: never on which other clients are in
the array, on their order, or on the rank that asks. The stream's base key comes from
``np.random.SeedSequence([seed, SYSTEM_KEY, stream])``; per-client words are absorbed with
the SplitMix64 finalizer, vectorised over clients (10^5 clients take about 10 ms, where
one ``default_rng`` per client would take seconds).
"""

from __future__ import annotations

import numpy as np

SYSTEM_KEY = 0x53595354  # "SYST": separates these streams from other components' keys

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


class KeyedUniform:
    """Uniforms on the open interval (0, 1) keyed by (seed, stream[, round], client).

    Parameters
    ----------
    seed : int
        Run seed (non-negative).
    stream : int
        Which quantity is drawn (compute speed, availability, ...); distinct streams
        are independent.
    """

    def __init__(self, seed: int, stream: int):
        if int(seed) < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        state = np.random.SeedSequence([int(seed), SYSTEM_KEY, int(stream)]).generate_state(
            2, np.uint64
        )
        self._base = state

    def draw(self, clients: np.ndarray, rnd: int | None = None, count: int = 1) -> np.ndarray:
        """Return a ``(len(clients), count)`` float64 array of uniforms in (0, 1)."""
        c = np.asarray(clients, dtype=np.int64).reshape(-1).astype(np.uint64)
        h = np.full(c.shape, self._base[0], dtype=np.uint64)
        if rnd is not None:
            r = np.full(c.shape, int(rnd), dtype=np.uint64)
            h = _mix(h ^ (r * _GOLDEN + self._base[1]))
        h = _mix(h ^ (c * _GOLDEN + ~self._base[1]))
        out = np.empty((c.size, count), dtype=np.float64)
        for j in range(count):
            offset = np.uint64(((j + 1) * int(_GOLDEN)) % 2**64)
            bits = _mix(h + offset) >> _S11  # 53 random bits
            out[:, j] = (bits.astype(np.float64) + 0.5) * 2.0**-53
        return out
