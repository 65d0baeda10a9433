"""Modules of "your own" code that the plug-in tests write next to their job files.

Each test writes the module under a name of its own (:func:`write_module`): one process imports a
module name once, so two tests must not share one with different code.
"""

import textwrap
import uuid
from pathlib import Path

# A small CNN for (C, H, W) inputs and an MLP with options of every kind: int, float, bool, str,
# list[int], and one without a default (a required key).
MODELS = '''
import torch
from torch import nn


class SmallCNN(nn.Module):
    """Conv 3x3 -> ReLU -> global average pool -> Linear."""

    def __init__(self, input_shape, num_classes, channels: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(input_shape[0], channels, 3, padding=1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def mlp(input_shape, num_classes, hidden: list[int] = [16], scale: float = 1.0, bias: bool = True,
        act: str = "relu", depth_check: int = 0):
    """An MLP over the flattened input; the last layer's initial weights times scale."""
    d = 1
    for s in input_shape:
        d *= s
    layers, width = [nn.Flatten()], d
    for h in hidden:
        layers += [nn.Linear(width, h, bias=bias), nn.ReLU() if act == "relu" else nn.Tanh()]
        width = h
    last = nn.Linear(width, num_classes, bias=bias)
    with torch.no_grad():
        last.weight.mul_(scale)
    return nn.Sequential(*layers, last)


def needs_width(input_shape, num_classes, width: int):
    """Required option: width."""
    return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()), width), nn.ReLU(),
                         nn.Linear(width, num_classes))
'''

# A dataset with natural clients and a partition of strides: client i gets rows i, i + K, i + 2K, ...
DATA = '''
import numpy as np


def load(seed, n: int = 40, m: int = 12, features: int = 3, classes: int = 3):
    """Gaussian blobs, one per class; rows n, test rows m; client = row % 4 (natural clients 10, 20, 30, 40)."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    yt = np.arange(m) % classes
    centers = rng.normal(size=(classes, features)) * 3
    x = centers[y] + rng.normal(size=(n, features))
    xt = centers[yt] + rng.normal(size=(m, features))
    return {"x": x, "y": y, "x_test": xt, "y_test": yt, "client": 10 * (np.arange(n) % 4 + 1),
            "client_test": 10 * (np.arange(m) % 4 + 1)}


def split(labels, num_clients, seed, offset: int = 0):
    """Client i gets rows i, i + K, i + 2K, ... (shifted by offset, cyclically)."""
    n = len(labels)
    return [(np.arange(i, n, num_clients) + offset) % n for i in range(num_clients)]
'''


def write_module(folder: Path, code: str, prefix: str = "mine") -> str:
    """Write ``code`` as a module of a fresh name into ``folder``; returns the module's name."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    (Path(folder) / f"{name}.py").write_text(textwrap.dedent(code))
    return name


def job_text(model: str, dataset: str = "digits", partition: str = "iid", extra: str = "", rounds: int = 3,
             clients: int = 4) -> str:
    """A small FedAvg job (3 rounds, 4 clients, 3 per round, 3 local steps) on the given components."""
    return f"""
[run]
name = "plug"
seed = 5
rounds = {rounds}
[data]
dataset = "{dataset}"
partition = "{partition}"
num_clients = {clients}
[model]
name = "{model}"
[algorithm]
name = "fedavg"
clients_per_round = 3
lr = 0.05
batch_size = 8
local_steps = 3
[runtime]
threads = 1
progress = "none"
""" + extra
