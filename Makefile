# The README's two commands: `make quickstart` and `make test`. Both install what they need.
PY ?= python3
# An unpinned torch pulls several GB of CUDA packages; 2.13.0 has a local CPU build here.
# On a GPU cluster: make TORCH=torch (or install your site's build first and set TORCH=).
TORCH ?= torch==2.13.0
MPIEXEC ?= mpiexec
PYTEST_MPI = $(PY) -m mpi4py -m pytest --with-mpi -q -p no:cacheprovider

.PHONY: install quickstart test test-unit test-mpi bench

install:
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test,mpich]'

quickstart: install
	$(PY) -m hpcfl run jobs/quickstart.toml --out runs/quickstart --force

test: install test-unit test-mpi

test-unit:
	$(PY) -m pytest -q tests/unit tests/e2e

# Every MPI test runs at 2 and at 3 ranks (3 is oversubscribed on 2 cores: correctness only).
test-mpi:
	$(MPIEXEC) -n 2 $(PYTEST_MPI) tests/mpi
	$(MPIEXEC) -n 3 $(PYTEST_MPI) tests/mpi

bench:
	$(PY) bench/reduce_bench.py
