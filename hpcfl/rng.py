"""Randomness as a pure function of (seed, stream, round, client).

Nothing is ever keyed by rank and no generator is advanced across clients, so moving a
client to another rank, or asking about clients in another order, never changes a draw
(fedjax's sampler follows the same rule).
"""

from __future__ import annotations

import numpy as np

# Stream ids separate independent uses of the same (seed, round, client).
COHORT = 1
CLIENT_TRAIN = 2
MODEL_INIT = 3
STEPS = 4
WEIGHTS = 5
EVAL = 6
STATS = 7   # samples drawn by a statistics phase before training
STRAGGLER = 8   # which clients are slow and by how much (the straggler steps policy)
CLIENT_EVAL = 9   # each client's held-out test rows (hpcfl.data.client_test)
CLIENT_PANEL = 10   # the clients whose rows results.h5 keeps (results.clients = sampled; hpcfl.io.panel)


def seed_sequence(seed: int, stream: int, rnd: int = 0, client: int = 0, draw: int = 0) -> np.random.SeedSequence:
    """The SeedSequence for one key; entropy mixes all the integers.

    ``draw`` > 0 keys a client's repeated draw within a round (sampling with replacement,
    each draw trained as its own instance); draw 0 keeps the four-word key, so runs
    without repeated draws are unchanged.
    """
    # SeedSequence needs non-negative words; -1 (e.g. "not tied to a round") maps to 2**32 - 1.
    words = [int(seed), int(stream), int(rnd) % 2**32, int(client)]
    return np.random.SeedSequence(words + [int(draw)] if draw else words)


def numpy_rng(seed: int, stream: int, rnd: int = 0, client: int = 0, draw: int = 0) -> np.random.Generator:
    """A numpy Generator keyed by (seed, stream, round, client[, draw])."""
    return np.random.default_rng(seed_sequence(seed, stream, rnd, client, draw))


def torch_seed(seed: int, stream: int, rnd: int = 0, client: int = 0, draw: int = 0) -> int:
    """A 63-bit integer seed for torch generators, keyed like :func:`numpy_rng`."""
    return int(seed_sequence(seed, stream, rnd, client, draw).generate_state(1, np.uint64)[0] >> np.uint64(1))


def torch_generator(device: torch.device, seed: int, stream: int, rnd: int = 0, client: int = 0,
                    draw: int = 0) -> torch.Generator:
    """A torch Generator on ``device`` keyed like :func:`numpy_rng`."""
    import torch   # here, not at the top: reading a job (hpcfl config, --help) must not import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(torch_seed(seed, stream, rnd, client, draw))
    return gen


def seed_device(device: torch.device, seed: int) -> None:
    """Seed torch's default generator of ``device`` (used by dropout and the like).

    ``torch.manual_seed`` also queues seeding of every accelerator backend and records a
    stack trace each call (about 1 ms); per client per round that dominated small models.
    """
    import torch

    if device.type == "cuda":
        torch.cuda.default_generators[device.index or 0].manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)
