"""Simulated clock: per-client device speed, bandwidth, availability and round time.

``[system] enabled = false`` (the default) means no clock: every client runs its planned
steps, nobody drops out and the simulated time stays 0. With ``enabled = true``:

Static profile (keyed by ``(seed, client)`` only)
    ``c_i``  seconds per step (``compute_unit = "step"``) or per sample (``"sample"``),
    ``up_i``, ``down_i``  uplink / downlink bandwidth in Mbit/s (``inf`` = free),
    each drawn from ``*_dist`` = constant | uniform | lognormal | trace (see
    :mod:`hpcfl.system.config` and :mod:`hpcfl.system.trace`).

Per-round draws (keyed by ``(seed, round, client)``)
    ``a_i``   available with probability ``1 - unavailability``;
    ``xi_i``  slowdown factor, 1 or U(slowdown_min, 1] (``slowdown_dist = "uniform"``);
    ``d_i``   reporting delay: none | constant(delay_s) | uniform(delay_low_s,
    delay_high_s) | exponential(mean delay_s).

Per client i of the round's cohort, with planned steps ``P_i``, batch size ``B_i``::

    step_i     = c_i / xi_i                 (unit "step")
               = c_i * B_i / xi_i           (unit "sample")
    download_i = download_bytes * 8 / (down_i * 1e6)
    upload_i   = upload_bytes   * 8 / (up_i   * 1e6)
    steps_i    = P_i                                          without a deadline
               = min(P_i, floor((deadline_s - download_i - upload_i - d_i) / step_i))
                 (floor taken with a relative slack of 1e-9; a negative budget gives 0;
                  if that is < P_i it is rounded down to a multiple of ``granularity``)
    compute_i  = (steps_i + f_i [steps_i < F_i]) * step_i
    f_i, F_i   finishing steps and full work (``plan``'s finish_steps and full_steps; f_i = 0
               unless a policy sets it, FedLGA's full_grad: ceil(n_i / B)): a client that
               stops short of F_i computes f_i steps' worth more after training, and under a
               deadline its steps_i are also at most floor((budget - f_i step_i) / step_i)
    total_i    = download_i + compute_i + d_i + upload_i      (arrival at the server)

A client is dropped (``steps_i = 0``, all its times 0) when it is unavailable, when
``P_i = 0``, or when under the deadline it cannot fit one step (one granule). The
round is synchronous::

    duration = max(total_i over participants)        (0 if nobody participates)
    if a deadline is set and some available client was dropped by it (the server waits
    for it until the deadline):   duration = deadline_s
    duration = min(duration, deadline_s) + server_s   (server_s: aggregation time)

Unavailable clients never extend the round (they decline at selection).

First K reports (``earliest_fraction`` < 1; GIFT's "the server only collects the 40%
reported the earliest", Chen et al. 2023), applied last, over the n clients given to
``plan`` (the round's cohort)::

    K = ceil(earliest_fraction * n)      (relative slack 1e-9: 0.07 * 100 gives 7; K >= 1)
    if at least K clients participate (available, one step fits the deadline):
        the K with the smallest total_i report (ties: lower client id); the others are
        LATE (steps_i = 0, all times 0: they are not trained)
        duration = K-th smallest total_i + server_s
    else: nothing changes (duration as above)

So the deadline acts first: a client cut by it can still be among the first K (with its
truncated steps), a dropped one cannot. The K-th report arrives before the deadline, so
the server stops waiting even when the deadline dropped someone. With fewer than K
participants the rules above hold: the server waits up to the deadline if the deadline
dropped someone (for reports that never come), else until the last report. With
``earliest_fraction = 1`` (the default) nobody is late.

Every per-client value is a pure function of its key, so ``plan`` on a cohort equals
the concatenation of ``plan`` on any split of it (and ``duration`` is the max of the
parts' durations): the clock is independent of the host and of the rank layout. The
first-K cut is the one global step: it needs the whole cohort, which the engine plans on
every rank, and its outcome (who reports, ``duration``) depends on the cohort as a set,
not on its order.

Calibrated seconds per local iteration of GIFT's testbed (its Table II) are in
``hpcfl.system.config.CALIBRATED_COMPUTE_S``.
"""

from .config import SystemOptions
from .model import (
    DEADLINE,
    LATE,
    NO_STEPS,
    OK,
    REASONS,
    UNAVAILABLE,
    RoundPlan,
    SystemModel,
)

__all__ = [
    "SystemOptions",
    "SystemModel",
    "RoundPlan",
    "OK",
    "UNAVAILABLE",
    "DEADLINE",
    "LATE",
    "NO_STEPS",
    "REASONS",
]
