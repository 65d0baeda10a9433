import sys

if sys.argv[1:2] == ["run"]:
    # First, before numpy/torch/MPI: a stop signal during start-up must be a stop request.
    from .signals import install

    install()

from .cli import main  # noqa: E402
from .parallel.exits import exit_all  # noqa: E402

# Every rank returns from main together: flush, finalise MPI and leave without the interpreter's
# teardown, which freed torch's and numpy's memory for 4-7 s after the summary (issue 38). Every
# file is closed by then (results, checkpoints, figures, exports).
exit_all(main())
