"""runtime.threads = 0: one torch thread for a small model, the rank's share of the cores above."""

import os

from hpcfl.parallel.runtime import SMALL_MODEL_PARAMS, pick_threads


def test_threads_from_the_models_size(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert pick_threads(0, 2, 4_810) == 1                       # the quickstart's MLP
    assert pick_threads(0, 2, SMALL_MODEL_PARAMS - 1) == 1
    assert pick_threads(0, 2, SMALL_MODEL_PARAMS) == 4          # 8 cores / 2 ranks on the node
    assert pick_threads(0, 3, 9_750_922) == 2                   # VGG-11: floor(8 / 3)
    assert pick_threads(3, 2, 4_810) == 3                       # runtime.threads wins
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert pick_threads(0, 1, 9_750_922) == 2                   # bound to 2 of the node's 8 cores
