"""The layout of the results file ``<out>/results.h5`` (written by :class:`hpcfl.io.results.ResultsWriter`,
read by :mod:`hpcfl.io.reader`).

Layout (every ``/metrics`` and ``/clients`` dataset is 1-D, resizable, and grows by
one row per round or per participating client; the file is flushed after every round)::

    /                      attrs: schema_version (2), config (JSON), config_sha256, run_id,
                                  versions (JSON: hpcfl, torch, ...), world_size, devices (JSON
                                  list, one per rank) of the latest segment, seed, status
                                  ("running" | "finished" | "diverged", 8 fixed bytes),
                                  resumed_at_round, diverged and diverged_round (false and 0
                                  unless it diverged);
                                  a run with code of its own (model.name = "nets:SmallCNN", ...)
                                  has plugins (JSON: {key: {name, file, sha256}}, the latest
                                  segment's modules: which file ran, and its SHA-256; each
                                  segment's versions hold its own under "plugins")
    /metrics/round                 int64    round number, 1-based: row r holds round r, measured
                                            after r rounds (the console's "round r/R")
    /metrics/train_loss            float64  weight-averaged mean local mini-batch loss
    /metrics/test_accuracy         float64  NaN on rounds without evaluation
    /metrics/test_loss             float64  NaN on rounds without evaluation
    /metrics/clients_participating int64    clients that trained and reported
    /metrics/global_train_loss, global_train_accuracy
                                   float64  global model on all clients' training samples
                                            (run.eval_train = true; else NaN)
    /metrics/lr                    float64  client learning rate of the round
    /metrics/tau_eff               float64  effective local steps: FedNova's tau_eff, or the
                                            implicit sum p_i ||a_i||_1 of averaging rules
    /metrics/nova_tau_eff, nova_chi2, nova_slowdown, nova_A, nova_B, nova_C
                                   float64  FedNova's diagnostics of the round's local work, for
                                            every algorithm (hpcfl.algorithms.nova_diag); NaN if
                                            nobody reported
    /metrics/sim_time              float64  cumulative simulated seconds ([system]; else 0)
    /metrics/sim_time_round        float64  simulated seconds of the round ([system]; else 0)
    /metrics/time_decide, time_train, time_reduce, time_server, time_eval, time_round
                                   float64  real seconds per phase on rank 0 (decide: weights,
                                            statistics phase, steps)
    /clients/round, /clients/client, /clients/steps      int64  (one row per cohort member;
                                                                round 1-based as above; with
                                                                results.clients = "sampled" the
                                                                panel's members only)
    /clients/weight, /clients/train_loss                 float64 (normalised weight; 0 and NaN if dropped)
    /clients/anorm                 float64  ||a_i||_1, FedNova's normaliser (= steps for plain SGD)
    /clients/anorm2, alast         float64  ||a_i||_2^2 and the last coefficient a_{i,-1}
    /clients/sim_time              float64  simulated arrival time of the client's update
    /clients/dropped               int8     0 reported; 1 unavailable; 2 missed the deadline;
                                            3 late; 4 no steps (hpcfl.system reason codes)
    /metrics/<policy field>, /clients/<policy field>
                                            records a policy declares (FedDisco's discrepancy,
                                            FedGSNR's GSNR, ...), see docs/architecture.md
    /controller_events             (round, old_tau, new_tau, reason) rows of the changes of tau
                                   by GIFT, AdaComm or AFL (written when the run finishes)
    (/final, /clients_summary and /controller_events are created with the file and filled when
    the run finishes: read them once status is "finished"; hpcfl.io.results_final)
    /client_eval/round, client, samples  int64   (run.eval_clients: one row per client per evaluated
                                                round; samples: its held-out test rows, drawn from the
                                                test set with its label mix, hpcfl.data.client_test)
    /client_eval/accuracy, loss    float64  the global model on the client's held-out rows
    /clients_summary/<field>_<stat> float64 (clients,) per-client median or mean over rounds
                                            of fields declared with a summary
    /clients_panel                 int64 (P,) results.clients = "sampled": the ids of the clients
                                   whose rows /clients keeps (hpcfl.io.panel); absent otherwise
    /segments/<column>             one row per start or resume of the run: start_round (int64,
                                   the first round it ran, 1-based), world_size (int64), devices
                                   and versions (JSON strings), started (UTC time string)
    /partition/class_counts        int64 (clients, classes)  training samples per class
    /final/params                  run dtype (L,) final flat model (parameters, then float buffers)
    /final/param_names             str (entries,) "param:<module path>" or "buffer:<path>"
    /final attrs                   shapes (JSON list of lists), input_shape (JSON list, one
                                   sample's shape), num_classes: what rebuilds the model

Every dataset carries the attributes ``unit`` and ``description``.

Rebuild the trained model: ``hpcfl.results.load(path).model()`` (a torch module in eval
mode); its weights alone: ``.state_dict()``.

Reading: the file of a run that finished, or was stopped by a signal or the guard, opens
with plain ``h5py.File(path)``. While a run is going, the writer holds it in HDF5 SWMR mode (single
writer, multiple readers), so ``hpcfl.results.load(path)`` or ``h5py.File(path, "r",
swmr=True)`` reads every flushed round. After a SIGKILL at most the round in flight is
lost; such a file (or one of a crashed run) is still marked "open for write" and opens only
with ``swmr=True`` (or the reader) until the run resumes and rewrites it cleanly. SWMR is kept on purpose: a
non-SWMR HDF5 file killed while open cannot be opened at all (docs/results.md). SWMR needs POSIX write ordering: on NFS or a parallel filesystem without it, set
``[results] locking = false`` and copy the file before reading it mid-run.
"""

from __future__ import annotations

import h5py
import numpy as np

from ..state import Field

CHUNK = 1024   # rows per chunk of every /metrics column, and of /clients for cohorts under COMPRESS_FROM
# /clients of a cohort of COMPRESS_FROM or more rows a round: one chunk per round (up to MAX_CHUNK rows), each
# compressed with HDF5's own filters (readable by any HDF5 reader, h5py included). A chunk is then written
# once, whole: a compressed chunk rewritten by a later append takes new room in a SWMR file and leaves the
# old one unused (10 rows a round in 1,024-row gzip chunks: a file 50x its data), so small cohorts keep
# CHUNK uncompressed (docs/results.md, "Large cohorts").
COMPRESS_FROM = 1024
MAX_CHUNK = 1 << 20
CLIENT_FILTERS = {"shuffle": True, "compression": "gzip", "compression_opts": 1}
# results.clients: every cohort row of every round, the rows of a fixed panel of clients (/clients_panel), or none
CLIENT_CHOICES = ("all", "sampled", "none")


def client_layout(cohort: int) -> dict:
    """h5py keywords (chunks and filters) of a ``/clients`` column for ``cohort`` rows a round."""
    if cohort < COMPRESS_FROM:
        return {"chunks": (CHUNK,)}
    return {"chunks": (min(int(cohort), MAX_CHUNK),), **CLIENT_FILTERS}
F64, I64 = np.float64, np.int64
METRICS = {
    "round": Field(I64, "round", "round number, 1-based (row r: after r rounds)"),
    "train_loss": Field(F64, "loss", "weight-averaged mean local mini-batch loss"),
    "test_accuracy": Field(F64, "1", "global model's test accuracy (NaN on rounds without evaluation)"),
    "test_loss": Field(F64, "loss", "global model's mean test loss (NaN on rounds without evaluation)"),
    "clients_participating": Field(I64, "clients", "clients that trained and reported"),
    "global_train_loss": Field(F64, "loss", "global model on all clients' training samples (run.eval_train)"),
    "global_train_accuracy": Field(F64, "1", "global model's accuracy on all training samples (run.eval_train)"),
    "lr": Field(F64, "1", "client learning rate of the round"),
    "tau_eff": Field(F64, "steps", "effective local steps: FedNova's tau_eff, or sum p_i ||a_i||_1"),
    # FedNova's diagnostics (Wang et al. 2020, Eqs. 5-6, 9-10) over the clients R that reported, p normalised
    # over R and w_i = p_i ||a_i||_1 / nova_tau_eff: what averaging the raw updates weighs, whatever the rule.
    "nova_tau_eff": Field(F64, "steps", "implicit effective steps of averaging, sum_R p_i ||a_i||_1 (p normalised)"),
    "nova_chi2": Field(F64, "1", "chi^2 divergence sum_R (p_i - w_i)^2 / w_i of p from the implicit weights "
                                 "w_i = p_i ||a_i||_1 / nova_tau_eff (Theorem 2)"),
    "nova_slowdown": Field(F64, "1", "tau_bar / nova_tau_eff, tau_bar = mean tau_i over R (Theorem 1)"),
    "nova_A": Field(F64, "1", "Theorem 1's A = m nova_tau_eff sum_R w_i^2 ||a_i||_2^2 / ||a_i||_1^2, m = |R|"),
    "nova_B": Field(F64, "steps", "Theorem 1's B = sum_R w_i (||a_i||_2^2 - a_{i,-1}^2)"),
    "nova_C": Field(F64, "steps^2", "Theorem 1's C = max_R (||a_i||_1^2 - ||a_i||_1 a_{i,-1})"),
    "sim_time": Field(F64, "s", "cumulative simulated time ([system]; else 0)"),
    "sim_time_round": Field(F64, "s", "simulated length of this round ([system]; else 0)"),
    "time_decide": Field(F64, "s", "real time of the decisions (weights, statistics phase, steps), rank 0"),
    "time_train": Field(F64, "s", "real time of local training, rank 0"),
    "time_reduce": Field(F64, "s", "real time of the reduction, waiting for slower ranks included, rank 0"),
    "time_server": Field(F64, "s", "real time of the server step and broadcasts, rank 0"),
    "time_eval": Field(F64, "s", "real time of evaluation, rank 0"),
    "time_round": Field(F64, "s", "real time of the whole round, rank 0"),
}
CLIENT_FIELDS = {
    "round": Field(I64, "round", "round number, 1-based"),
    "client": Field(I64, "client", "client id"),
    "steps": Field(I64, "steps", "local steps run (after the system model's deadline)"),
    "weight": Field(F64, "1", "normalised aggregation weight (0 if the client did not report)"),
    "train_loss": Field(F64, "loss", "mean local mini-batch loss (NaN if the client did not train)"),
    "anorm": Field(F64, "steps", "||a_i||_1, FedNova's normaliser (= steps for plain SGD)"),
    "anorm2": Field(F64, "steps", "||a_i||_2^2 of the gradient coefficients (= steps for plain SGD; 0 if the "
                                  "client did not report)"),
    "alast": Field(F64, "1", "a_{i,-1}, the last gradient's coefficient (1 without in-round lr decay; 0 if the "
                             "client did not report)"),
    "sim_time": Field(F64, "s", "simulated arrival time of the client's update"),
    "dropped": Field(np.int8, "code", "0 reported; 1 unavailable; 2 missed the deadline; 3 late; 4 no steps; "
                                      "5 refused by the guard"),
}
# /client_eval: one row per client per evaluated round (run.eval_clients; hpcfl.data.client_test draws the rows)
CLIENT_EVAL = {
    "round": Field(I64, "round", "evaluated round, 1-based (row r of /metrics)"),
    "client": Field(I64, "client", "client id"),
    "accuracy": Field(F64, "1", "global model's accuracy on the client's held-out test rows (NaN: none)"),
    "loss": Field(F64, "loss", "global model's mean loss on the client's held-out test rows (NaN: none)"),
    "samples": Field(I64, "samples", "the client's held-out test rows (its label mix, drawn from the test set)"),
}
SUMMARIES = {"median": np.nanmedian, "mean": np.nanmean}
# 2: rounds 1-based, /segments, /final in the run's dtype with the model's input shape.
# 3: /final, /clients_summary and /controller_events exist from the start (filled when the run ends: read
# them once status is "finished"), status is a fixed-size string, diverged and diverged_round always there.
# Files without the attribute are version 1 (rounds 0-based); the reader converts them.
SCHEMA_VERSION = 3
SEGMENT_COLUMNS = {   # name -> (dtype, unit, description)
    "start_round": (I64, "round", "first round this segment ran (1-based)"),
    "world_size": (I64, "ranks", "MPI ranks of this segment"),
    "devices": (h5py.string_dtype(), "JSON", "device of each rank"),
    "versions": (h5py.string_dtype(), "JSON", "hpcfl, torch, numpy, mpi4py, h5py and MPI versions"),
    "started": (h5py.string_dtype(), "UTC", "wall-clock start of the segment"),
}
