"""``hpcfl data list | get``: which datasets hpcfl knows, and downloading one from its source.

``list`` prints every dataset: what it needs, its official source, size and checksum, or
"generated, no download" with nothing to fetch, or (``leaf``, ``tff``, ``npz``) where such files
come from, in words (:data:`hpcfl.data.sources.ELSEWHERE`). ``get NAME --root DIR`` downloads, verifies
and unpacks it (:mod:`hpcfl.data.fetch`) and prints the ``data.root`` line for the job.
Exit 0 done, 2 for anything the user must act on (unknown name, no network, a wrong file, a
planted link), 75 when Ctrl-C stopped a download (one line says what was kept; the same command
resumes it), as a stopped ``hpcfl run`` or ``hpcfl sweep``.
"""

from __future__ import annotations

import os
import sys

from ..errors import HpcflError, nearest
from ..parallel.exits import EXIT_INPUT, EXIT_RESUMABLE


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="list the datasets and download one from its official source",
                       description="hpcfl data list: every dataset, its source, size and checksum. "
                                   "hpcfl data get NAME --root DIR: download, verify and unpack it.")
    dsub = p.add_subparsers(dest="data_cmd", required=True)
    dsub.add_parser("list", help="every dataset: what it needs, source URL, size, checksum")
    g = dsub.add_parser("get", help="download a dataset, verify its checksum, unpack it under --root")
    g.add_argument("name", help="dataset name as in data.dataset, e.g. cifar10")
    g.add_argument("--root", required=True, metavar="DIR", help="folder to put it in; the job's data.root")
    g.add_argument("--mirror", metavar="URL",
                   help="fetch <URL>/<file name> instead of the official address (default: $HPCFL_DATA_MIRROR)")


def list_text() -> str:
    from ..data import DATASETS
    from ..data.fetch import checksum_text, size_text
    from ..data.sources import ELSEWHERE, SOURCES, STAND_INS

    lines = []
    for name, spec in DATASETS.items():
        src = SOURCES.get(name)
        if name in ELSEWHERE:   # files the field's own scripts make: where from, in words
            first, *more = ELSEWHERE[name]
            lines.append(f"{name}: {spec.doc}; {first}")
            lines += [f"    {line}" for line in more]
            continue
        if src is None:
            how = "bundled with scikit-learn, no download" if name == "digits" else "generated, no download"
            lines.append(f"{name}: {spec.doc}; {how}")
            continue
        lines.append(f"{name}: needs {src.needs}; {src.homepage}")
        for r in src.files:
            lines.append(f"    {r.url}  {size_text(r)}  {checksum_text(r)}")
        lines.append(f"    hpcfl data get {name} --root DIR   (CPU stand-in: {STAND_INS[name]})")
    return "\n".join(lines) + "\n"


def main(args, comm) -> int:
    if comm.rank != 0:
        return 0
    if args.data_cmd == "list":
        sys.stdout.write(list_text())
        return 0
    from ..data.fetch import MIRROR_ENV, get
    from ..data.sources import ELSEWHERE, SOURCES

    src = SOURCES.get(args.name)
    if args.name in ELSEWHERE:
        print(f"hpcfl data get: {args.name!r} is not downloaded by hpcfl: {' '.join(ELSEWHERE[args.name])}",
              file=sys.stderr)
        return EXIT_INPUT
    if src is None:
        from ..data import DATASETS

        if args.name in DATASETS:
            print(f"hpcfl data get: {args.name!r} needs no download ({DATASETS[args.name].doc}); "
                  f"set data.dataset = {args.name!r} and run", file=sys.stderr)
            return EXIT_INPUT
        guess = nearest(args.name, SOURCES)
        print(f"hpcfl data get: no dataset {args.name!r}; " +
              (f"did you mean {guess!r}? " if guess else "") + f"choose one of {', '.join(SOURCES)}",
              file=sys.stderr)
        return EXIT_INPUT
    mirror = args.mirror or os.environ.get(MIRROR_ENV) or None
    try:
        root = get(args.name, src, args.root, mirror, say=lambda s: print(s, flush=True))
    except HpcflError as exc:   # Interrupted (Ctrl-C) among them, with its own exit code
        print(f"hpcfl data get: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:   # outside a file's download (before or after): still one line, no traceback
        print("hpcfl data get: interrupted; nothing more was placed where a run reads: run the same command "
              "again", file=sys.stderr)
        return EXIT_RESUMABLE
    print(f"{args.name} is ready. In the job:\n  [data]\n  dataset = \"{args.name}\"\n  root = \"{root}\"\n"
          f"or: --set data.dataset={args.name} --set data.root={root}")
    return 0
