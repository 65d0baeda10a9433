"""The engine: a run from start to end, the round loop and what runs around it.

``job`` (JobRun: plan, commit, open, loop, finish; what hpcfl.run drives), ``planning`` (what
``--out`` holds, the checkpoint to resume from, the first changes to files), ``events`` (what
callbacks receive), ``setup`` (prepare: what a rank builds before the first round),
``simulation`` (the one loop), ``control`` (stops, watchdog, guards, fault injection), ``resume``
(checkpoint capture and restore), ``evaluation`` (the global model's test, split over ranks),
``records`` (a round's records) and ``placement`` (per-client rows that travel with a client dealt
to another rank). It may import every layer below it (docs/architecture.md); hpcfl.run, the
command line and the benchmarks import it.
"""
