"""The engine: the round loop and what runs around it.

``simulation`` (prepare and run: the one loop), ``control`` (stops, watchdog, guards, fault
injection), ``resume`` (checkpoint capture and restore), ``evaluation`` (the global model's test,
split over ranks), ``records`` (a round's records) and ``placement`` (per-client rows that travel
with a client dealt to another rank). It may import every layer below it (docs/architecture.md);
only the command line and the benchmarks import it.
"""
