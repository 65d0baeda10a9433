"""``hpcfl config``: a job fully resolved as commented TOML, and every key's default and help.

::

    hpcfl config JOB [--set K=V ...]     # the resolved job: valid TOML, every key with its help
    hpcfl config --defaults              # every section's and component's keys, after their list
    hpcfl config --defaults SECTION      # one table's keys: default, type or choices, help

The printed job holds every section and the chosen components' sub-tables with every
default filled in; keys that are unset (None) appear commented out. Read back with
``tomllib`` and :func:`hpcfl.config.from_dict`, it gives the same config (same digest);
this is checked before anything is printed. A ``[sweep]`` table is set aside before the
job is resolved and printed back unchanged at the end.

The help text of a key is the ``"help"`` entry of its dataclass field's metadata (the
sections in :mod:`hpcfl.config`, every component's option dataclass). Torch is imported
only when the command runs (the registries live beside the models).
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from ..errors import HpcflError
from ..parallel.exits import EXIT_INPUT

# One line per section, in the order Config.to_dict writes them.
SECTION_DOCS = {
    "run": "the run: name, seed, number of rounds, evaluation",
    "data": "dataset, its split over the clients, number of clients",
    "model": "model architecture",
    "algorithm": "FL algorithm: preset, the four policy slots, client optimiser, sampling, lr schedule",
    "runtime": "execution: reduction, device, threads, precision, client placement, progress output",
    "system": "simulated clock: device speeds, bandwidths, availability, deadlines (off unless enabled)",
    "checkpoint": "checkpoints to resume from after a stop, a crash or a preemption",
    "guard": "client updates holding NaN/Inf or a huge norm",
    "watchdog": "end a job whose rank froze (exit 75, resumable) instead of letting it hang",
    "results": "the results file, <out>/results.h5",
}

# Policies with an [algorithm.<name>] table; a policy registered later falls back to its docstring.
POLICY_DOCS = {
    "random_epochs": "E_i(t) ~ U{low..high} local epochs, drawn per client and round (FedNova)",
    "client_steps": "per-client step counts: an explicit list or a distribution",
    "nova": "FedNova: updates normalised by ||a_i||_1, rescaled by the effective steps tau_eff",
    "disco": "FedDisco: weights proportional to max(n_k - a d_k + b, 0)",
    "gsnr": "FedGSNR: a budget of local steps shared by gradient signal-to-noise ratio",
}


@dataclass(frozen=True)
class Table:
    """One TOML table of a job: ``name`` ("algorithm", "data.dirichlet"), its option dataclass and a doc line."""

    name: str
    cls: type
    doc: str


def add_parser(sub) -> None:
    p = sub.add_parser(
        "config", help="print a job fully resolved (every default, with help), or the defaults of a section",
        description="Print JOB fully resolved as TOML, every key with a '# help' line (valid TOML: save it as a "
                    "job file), or with --defaults the keys of a section or component.")
    p.add_argument("job", nargs="?", help="TOML job file, e.g. jobs/quickstart.toml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set algorithm.lr=0.05 (repeatable)")
    p.add_argument("--defaults", nargs="?", const="", metavar="SECTION",
                   help="list the keys of SECTION (algorithm, system, data.dirichlet, model.mlp, algorithm.gsnr, "
                        "...) with default, type and help; without SECTION, the list of sections and components "
                        "followed by every one's keys")


def main(args, comm) -> int:
    """``hpcfl config``: rank 0 prints; exit 2 on bad input."""
    if comm.rank != 0:
        return 0
    try:
        if args.defaults is not None:
            if args.job is not None or args.overrides:
                raise HpcflError("--defaults lists a section's defaults and takes no JOB or --set; run "
                                 "`hpcfl config JOB` for a job, `hpcfl config --defaults SECTION` for defaults")
            text = defaults_text(args.defaults)
        elif args.job is None:
            raise HpcflError("give a job file (`hpcfl config jobs/quickstart.toml`) or --defaults [SECTION]")
        else:
            text = job_text(args.job, args.overrides)
    except HpcflError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INPUT
    sys.stdout.write(text)
    return 0


# ---- the catalogue of tables -----------------------------------------------------------------

def section_classes() -> dict[str, type]:
    """Section name -> its dataclass, in ``Config.to_dict`` order."""
    from .. import config
    from ..system import SystemOptions

    return {"run": config.RunSection, "data": config.DataSection, "model": config.ModelSection,
            "algorithm": config.AlgorithmSection, "runtime": config.RuntimeSection, "system": SystemOptions,
            "checkpoint": config.CheckpointSection, "guard": config.GuardSection,
            "watchdog": config.WatchdogSection, "results": config.ResultsSection}


def _docline(cls) -> str:
    """First line of a class docstring; '' for the signature dataclasses write when there is none."""
    doc = (cls.__doc__ or "").strip()
    return "" if doc.startswith(f"{cls.__name__}(") else doc.split("\n")[0].strip()


def _policy_doc(name: str, cls) -> str:
    from ..algorithms import registry

    slot = next((s for s, reg in registry.SLOTS.items() if name in reg), "policy")
    return f"{slot} = {name!r}: {POLICY_DOCS.get(name) or _docline(cls)}"


def tables() -> dict[str, Table]:
    """Every table a job may hold: the sections, then data.*, model.* and algorithm.* components."""
    from .. import data, models
    from ..algorithms import registry

    out = {name: Table(name, cls, SECTION_DOCS.get(name, "")) for name, cls in section_classes().items()}
    for kind, reg in (("dataset", data.DATASETS), ("partition", data.PARTITIONS)):
        out.update({f"data.{n}": Table(f"data.{n}", spec.options, f"{kind}: {spec.doc}") for n, spec in reg.items()})
    out.update({f"model.{n}": Table(f"model.{n}", spec.options, spec.doc) for n, spec in models.MODELS.items()})
    out.update({f"algorithm.{n}": Table(f"algorithm.{n}", cls, _policy_doc(n, cls))
                for n, cls in registry.OPTIONS.items()})
    return out


def name_choices() -> dict[str, tuple]:
    """Choices of the keys that name a component (registry keys, not field metadata)."""
    from .. import data, models

    return {"data.dataset": tuple(data.DATASETS), "data.partition": tuple(data.PARTITIONS),
            "model.name": tuple(models.MODELS)}


# ---- describing one key ----------------------------------------------------------------------

_BOUND_SIGNS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
_UNIONS = (typing.Union, types.UnionType)


def type_text(tp) -> str:
    """'integer', 'list of number', 'string or unset' ... for a field's type hint."""
    origin = typing.get_origin(tp)
    if origin in _UNIONS:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        unset = len(args) < len(typing.get_args(tp))
        return " or ".join(type_text(a) for a in args) + (" or unset" if unset else "")
    if origin is tuple:
        return f"list of {type_text(typing.get_args(tp)[0])}"
    plain = {int: "integer", float: "number", bool: "true/false", str: "string"}
    return plain.get(tp, getattr(tp, "__name__", str(tp)))


def constraint_text(meta) -> str:
    """'> 0, < 1' from a field's bound metadata; '' without bounds."""
    return ", ".join(f"{sign} {meta[key]}" for key, sign in _BOUND_SIGNS if key in meta)


def choices_of(table: str, f: dataclasses.Field, names: dict) -> tuple:
    return tuple(f.metadata.get("choices") or names.get(f"{table}.{f.name}", ()))


def value_text(value) -> str:
    """A value as TOML (``(unset)`` for None)."""
    from .sweep import toml_value

    return "(unset)" if value is None else toml_value(value)


# ---- hpcfl config --defaults -----------------------------------------------------------------

def defaults_text(section: str) -> str:
    """The keys of one table with default, type or choices, and help; '' lists the tables."""
    cat = tables()
    if not section:   # the whole reference: the list, then every table's keys
        return catalogue_text(cat) + "".join("\n" + defaults_text(name) for name in cat)
    if section not in cat:
        raise HpcflError(f"unknown section {section!r} for --defaults; {_suggest(section, list(cat))}\n\n"
                         + catalogue_text(cat))
    t, names = cat[section], name_choices()
    hints = typing.get_type_hints(t.cls)
    rows = []
    for f in dataclasses.fields(t.cls):
        choices, tp = choices_of(t.name, f, names), hints[f.name]
        kind = type_text(tp)
        if choices:
            kind = f"one of: {' | '.join(map(str, choices))}" + (", or unset" if kind.endswith(" or unset") else "")
        bounds = constraint_text(f.metadata)
        rows.append((f"{f.name} = {value_text(f.default)}", f"{kind}{', ' + bounds if bounds else ''}",
                     f.metadata.get("help", "")))
    lines = [f"[{t.name}]  {t.doc}".rstrip(), ""]
    width = max((len(r[0]) for r in rows), default=0)
    for key, kind, helptext in rows:
        lines += [f"  {key.ljust(width)}   {kind}", f"      {helptext}"]
    if not rows:
        lines.append("  (no options)")
    subs = [n for n in cat if n.startswith(f"{section}.")]
    if subs:
        lines += ["", f"Components with their own [{section}.<name>] table (hpcfl config --defaults "
                      f"{section}.<name>):", "  " + ", ".join(n.split(".", 1)[1] for n in subs)]
    return "\n".join(lines) + "\n"


def catalogue_text(cat: dict[str, Table]) -> str:
    width = max(len(n) for n in cat)
    sections = [n for n in cat if "." not in n]
    lines = ["Sections (hpcfl config --defaults SECTION):"]
    lines += [f"  {n.ljust(width)}  {cat[n].doc}" for n in sections]
    lines += ["", "Components, each with its own table (hpcfl config --defaults data.dirichlet):"]
    lines += [f"  {n.ljust(width)}  {cat[n].doc}" for n in cat if "." in n]
    return "\n".join(lines) + "\n"


def _suggest(word: str, names: list[str]) -> str:
    """'did you mean ...?': close names of the same depth, then components whose own name is close."""
    depth = word.count(".")
    found = difflib.get_close_matches(word, [n for n in names if n.count(".") == depth], n=3, cutoff=0.6)
    if depth == 0:   # 'dirichlet' for data.dirichlet
        leaves = {n.split(".", 1)[1]: n for n in names if "." in n}
        found += [leaves[leaf] for leaf in difflib.get_close_matches(word, list(leaves), n=3, cutoff=0.8)]
    found = list(dict.fromkeys(found))
    return f"did you mean {' or '.join(found)}?" if found else "none is close; the list follows"


# ---- hpcfl config JOB ------------------------------------------------------------------------

def resolved_tables(cfg) -> list[tuple[str, object, str]]:
    """(table name, option object, doc line) of a resolved job, in ``Config.to_dict`` order."""
    cat = tables()
    out = []
    for name in section_classes():
        out.append((name, getattr(cfg, name), SECTION_DOCS.get(name, "")))
        if name == "data":
            for comp, opts in ((cfg.data.dataset, cfg.dataset_options), (cfg.data.partition, cfg.partition_options)):
                out.append(_component_table("data", comp, opts, cat))
        elif name == "model":
            out.append(_component_table("model", cfg.model.name, cfg.model_options, cat))
        elif name == "algorithm":
            seen = set()
            for slot, opts in cfg.policy_options.items():
                comp = getattr(cfg.algorithm, slot)
                if comp not in seen:   # one policy in two slots (FedDyn's dyn: local and server) has one table
                    seen.add(comp)
                    out.append((f"algorithm.{comp}", opts, cat[f"algorithm.{comp}"].doc))
    return out


def _component_table(section: str, name: str, opts, cat: dict) -> tuple[str, object, str]:
    """(table name, options, doc line) of a chosen component; a plug-in's table is named after its
    attribute and its doc line names its code (hpcfl.plugins)."""
    from .. import plugins

    plugin = plugins.of(opts)
    if plugin is None:
        return f"{section}.{name}", opts, cat[f"{section}.{name}"].doc
    return f"{section}.{plugins.table_name(name)}", opts, f"{plugin.kind} of your own, {plugin.name}: {plugin.doc}"


def table_lines(name: str, obj, doc: str, names: dict) -> list[str]:
    """``[name]  # doc`` then, per key, its help comment and ``key = value`` (commented out when unset)."""
    lines = ["", f"[{name}]" + (f"  # {doc}" if doc else "")]
    fields = dataclasses.fields(obj)
    if not fields:
        lines.append("# (no options)")
    for f in fields:
        choices = choices_of(name, f, names)
        helptext = f.metadata.get("help", "")
        if choices:
            helptext += f" [{' | '.join(map(str, choices))}]"
        value = getattr(obj, f.name)
        lines.append(f"# {helptext.strip()}")
        lines.append(f"# {f.name} = (unset)" if value is None else f"{f.name} = {value_text(value)}")
    return lines


def job_text(job, overrides: list[str]) -> str:
    """The resolved job as commented TOML; raises ConfigError for a bad job, HpcflError if it cannot be written."""
    from .. import config
    from ..config import notices
    from .sweep import toml_document

    table = config.read_job(job)
    job_dir = Path(job).resolve().parent   # where a plug-in's module is looked for, as hpcfl run does
    sweep = table.pop("sweep") if isinstance(table.get("sweep"), dict) else None
    notes: list[str] = []
    table = config.apply_overrides(table, overrides, notes)
    missing = [name for name in ("data", "model") if name not in table]
    try:
        cfg = config.from_dict(table, job_dir)
    except config.ConfigError as exc:
        if missing:
            raise config.ConfigError(notices.missing_tables(f"job file {str(job)!r}", missing) + exc.problems) from None
        raise
    if missing:
        raise config.ConfigError(notices.missing_tables(f"job file {str(job)!r}", missing))
    names = name_choices()
    lines = [f"# {job}, fully resolved by `hpcfl config`: every key with its default filled in.",
             "# Valid TOML: save it as a job file and edit. Keys marked (unset) are commented out.",
             f"# config digest (config_sha256 in results.h5): {cfg.digest()}"]
    lines += [f"# --set {text}" for text in overrides]
    lines += [f"# note: {note}" for note in notes + notices.start_notes(cfg)]
    for name, obj, doc in resolved_tables(cfg):
        lines += table_lines(name, obj, doc, names)
    text = "\n".join(lines) + "\n"
    _check_round_trip(text, dataclasses.replace(cfg, job_dir=str(job_dir)))
    if sweep is not None:
        text += "\n" + toml_document({"sweep": sweep}, header="[sweep] as in the job file; run the grid with "
                                                              "`hpcfl sweep JOB`").lstrip("\n")
    return text


def _check_round_trip(text: str, cfg) -> None:
    """The printed job must read back as the same config; refuse to print a wrong one."""
    import tomllib

    from .. import config

    try:
        same = config.from_dict(tomllib.loads(text), cfg.job_dir).to_json() == cfg.to_json()
    except (tomllib.TOMLDecodeError, HpcflError):
        same = False
    if not same:
        raise HpcflError("the resolved job cannot be written as TOML that reads back unchanged (a string with "
                         "unusual characters?); run it as it is, or simplify its strings")
