# The README's two commands: `make quickstart` and `make test`. Both install what they need.
PY ?= python3
# The torch that `install` puts in first. From PyPI this is the CUDA build on Linux (several GB of
# nvidia-* packages) unless pip finds a local CPU wheel; README, "Which torch": the CPU-only index.
# TORCH= installs no torch and keeps the one already there (a CPU wheel, your site's build).
TORCH ?= torch==2.13.0
# hpcfl's extras. mpich brings an MPI for workstations; on a cluster use EXTRAS=test so that the
# site's MPI is not shadowed (README: "On a cluster").
EXTRAS ?= test,mpich
MPIEXEC ?= mpiexec
# mutation testing's scope (tools/mutation.py --list): parallel, io, engine, data, algorithms, or all;
# srun: slurm/hpcfl_srun.sh through tools/mutation_shell.py (mutmut mutates Python only)
SCOPE ?= parallel
PYTEST_MPI = $(PY) -m mpi4py -m pytest --with-mpi -q -p no:cacheprovider

.PHONY: install quickstart test test-unit test-mpi bench mutation

install:
	$(if $(strip $(TORCH)),$(PY) -m pip install -q $(TORCH))
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'

quickstart: install
	$(PY) -m hpcfl run jobs/quickstart.toml --out runs/quickstart --force

test: install test-unit test-mpi

test-unit:
	$(PY) -m pytest -q -n 2 --dist loadfile tests/unit tests/e2e

# Every MPI test runs at 2 and at 3 ranks (3 is oversubscribed on 2 cores: correctness only).
test-mpi:
	$(MPIEXEC) -n 2 $(PYTEST_MPI) tests/mpi
	$(MPIEXEC) -n 3 $(PYTEST_MPI) tests/mpi
	$(MPIEXEC) -n 4 $(PYTEST_MPI) tests/mpi/test_equivalence.py tests/mpi/test_fedlga_mpi.py -k "lga or dyn"

bench:
	$(PY) bench/reduce_bench.py

# Mutation testing (docs/testing.md): mutmut on one scope's modules with its unit tests, in a scratch
# copy; prints the score per module and each surviving mutant's diff. Not part of `make test`.
# The launcher's tests mostly wait on sleeps, so its scope runs 8 pytest workers on any core count.
mutation:
	$(if $(filter srun,$(SCOPE)),$(PY) tools/mutation_shell.py -n 8 --timeout 300,$(PY) tools/mutation.py $(SCOPE))
