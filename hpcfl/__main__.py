import sys

if sys.argv[1:2] == ["run"]:
    # First, before numpy/torch/MPI: a stop signal during start-up must be a stop request.
    from .signals import install

    install(startup=True)   # until hpcfl.cli.run says start-up is over

from .cli import finish, main  # noqa: E402

finish(main(), sys.argv[1:2])
