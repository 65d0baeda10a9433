"""Device memory of per-client state: SCAFFOLD's c_i for 1,000 clients of LeNet-5 (62,006 parameters)
on one rank, with the round's device sums, in the model's dtype (float32).

    python bench/client_state_memory.py [--clients 1000] [--model lenet5]

Prints the bytes the per-client table holds and the peak memory torch allocated on the device
(CUDA), or the tables' bytes on a CPU. Target (docs/workloads.md): under 1 GB per rank.
"""

import argparse

import numpy as np
import torch

from hpcfl import config, models
from hpcfl.algorithms import Algorithm
from hpcfl.parallel.comm import make_sum
from hpcfl.params import FlatModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--model", default="lenet5")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = config.from_dict({"data": {"dataset": "synthetic_images", "num_clients": a.clients},
                            "model": {"name": a.model}, "algorithm": {"name": "scaffold", "local_steps": 1}})
    model = FlatModel(models.build_model(a.model, cfg.model_options, (3, 32, 32), 10), dev, torch.float32)
    algo = Algorithm(cfg, model.length, model.num_params, a.clients, dev, torch.float32,
                     np.full(a.clients, 100, dtype=np.int64))
    table = algo.extras[0]._rows.tensor()        # (clients, P) on the device
    table.add_(1.0)                          # touched, as after a round
    acc = make_sum("exact", algo.layout.length, None, dev if dev.type == "cuda" else None)
    acc.reset(a.clients)
    mb = table.numel() * table.element_size() / 2**20
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else float("nan")
    print(f"{a.clients} clients x {model.num_params} parameters: per-client table {mb:.0f} MB; peak allocated on "
          f"{dev} {peak:.0f} MB (with the model and the round's sum buffers)")


if __name__ == "__main__":
    main()
