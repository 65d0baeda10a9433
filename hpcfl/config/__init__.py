"""Job configuration: TOML job files loaded into frozen dataclasses.

A job file has the sections ``[run] [data] [model] [algorithm] [runtime]`` (and
``[system]`` for the simulated clock; ``[paper]`` for the paper's figures a paper job quotes,
checked by :mod:`hpcfl.config.paper` and ignored by the run). Components chosen by name take their own options
from a sub-table named after them, e.g. ``[data] partition = "dirichlet"`` with
``[data.dirichlet] alpha = 0.5``. ``--set a.b=value`` overrides any key; ``value`` is
parsed as a TOML value (``--set algorithm.lr=0.05``, ``--set model.mlp.hidden=[64,32]``)
and taken as a plain string when it does not parse (``--set data.root=/scratch/cifar``).

Every problem found is reported at once, each naming its key and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tomllib
from dataclasses import dataclass, field

from ..algorithms import milestone_rounds, registry
from ..errors import ConfigError
from ..plugins import is_plugin, table_name
from . import paper, sections
from .components import component_options, table_clashes
from .notices import missing_tables
from .options import build, build_partial
from .read import read_any, read_job  # noqa: F401  (read_job: callers have always found it here)
# The sections live in hpcfl/config/sections.py; re-exported here, where callers have always found them.
from .sections import (LOCAL_SOLVERS, POLICY_SLOTS, PRESETS, RUN_NAME, SAMPLING, SERVER_RULES,  # noqa: F401
                       STEPS_POLICIES, WEIGHTS_POLICIES, AlgorithmSection, CheckpointSection, DataSection, GuardSection,
                       ModelSection, ResultsSection, RunSection, RuntimeSection, WatchdogSection)
from .tomltext import flatten  # noqa: F401  (re-exported: callers read the job as dotted keys from here)

SWEEP_REFUSED = "this job declares a [sweep]; run it with `hpcfl sweep JOB` (or remove the [sweep] table)"

# Keys that may differ between a checkpoint's job and the resuming job; the run names them when it resumes.
SAFE_TO_CHANGE = ("run.rounds", "run.eval_every", "runtime.progress", "runtime.threads", "runtime.device",
                  "runtime.share_gpus", "runtime.placement", "runtime.eval_batch_size", "runtime.lanes", "runtime.step",
                  "data.cache", "checkpoint.",
                  "watchdog.", "results.locking", "results.flush_seconds")   # not results.clients: one per file


@dataclass(frozen=True)
class Config:
    """The resolved job. ``*_options`` are the chosen components' option dataclasses."""

    run: RunSection
    data: DataSection
    model: ModelSection
    algorithm: AlgorithmSection
    runtime: RuntimeSection
    dataset_options: object
    partition_options: object
    model_options: object
    policy_options: dict = field(default_factory=dict)   # slot -> [algorithm.<chosen name>] options
    system: object = None            # hpcfl.system.SystemOptions
    checkpoint: CheckpointSection = CheckpointSection()
    guard: GuardSection = GuardSection()
    watchdog: WatchdogSection = WatchdogSection()
    results: ResultsSection = ResultsSection()
    job_dir: str | None = None       # where relative paths (system.trace) resolve and plug-ins are found; not the job
    notes: tuple[str, ...] = ()      # what reading the job decided for the user (--set dropped a table); not the job

    def to_dict(self) -> dict:
        """A JSON-ready dict that round-trips through :func:`from_dict`."""
        d = {}
        for name in ("run", "data", "model", "algorithm", "runtime", "system", "checkpoint", "guard", "watchdog",
                     "results"):
            d[name] = dataclasses.asdict(getattr(self, name))
        # a plug-in's options under its attribute's name, as the job gives them ([model.SmallCNN])
        d["data"][table_name(self.data.dataset)] = dataclasses.asdict(self.dataset_options)
        d["data"][table_name(self.data.partition)] = dataclasses.asdict(self.partition_options)
        d["model"][table_name(self.model.name)] = dataclasses.asdict(self.model_options)
        for slot, opts in self.policy_options.items():
            d["algorithm"][getattr(self.algorithm, slot)] = dataclasses.asdict(opts)
        return _drop_none(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def plugins(self) -> dict:
        """``{key: {"name", "file", "sha256"}}`` of the job's plug-ins (results.h5's ``plugins``
        attribute): which code ran, for a later reader."""
        from .. import plugins

        found = {}
        for key, opts in (("data.dataset", self.dataset_options), ("data.partition", self.partition_options),
                          ("model.name", self.model_options)):
            plugin = plugins.of(opts)
            if plugin is not None:
                found[key] = plugin.provenance()
        return found

    def digest(self) -> str:
        """SHA-256 of the canonical JSON: identifies the job for resume and provenance."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def _drop_none(obj):
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, tuple):
        return list(obj)
    return obj


def parse_override(text: str) -> tuple[list[str], object]:
    """Split ``a.b.c=value`` into (["a","b","c"], parsed value)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r} is not of the form section.key=value (e.g. --set algorithm.lr=0.05)")
    key, raw = text.split("=", 1)
    path = [k.strip() for k in key.strip().split(".")]
    if len(path) < 2 or not all(path):
        raise ConfigError(f"--set {text!r}: the key must be section.key, e.g. algorithm.lr")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:
        raise ConfigError(f"--set {key}=...: the value nests arrays too deeply") from None
    return path, value


def apply_overrides(table: dict, overrides: list[str], notes: list[str] | None = None) -> dict:
    """Apply ``--set`` overrides to a parsed job (returns a new dict).

    An override that changes which component is chosen (``data.partition``,
    ``data.dataset``, ``model.name``, an algorithm slot or preset) drops the sub-table of
    the component it replaces, e.g. ``[data.dirichlet]`` after ``--set
    data.partition=pareto``, and says so in ``notes`` (when given): the old table's
    options cannot apply to the new component.
    """
    before = chosen_tables(table)
    table = json.loads(json.dumps(table))
    set_paths = []
    for text in overrides:
        path, value = parse_override(text)
        node = table
        for k in path[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {'.'.join(path[:-1])} is a value, not a section")
        node[path[-1]] = value
        set_paths.append(".".join(path))
    after = chosen_tables(table)
    for sub in sorted(before - after):
        section, name = sub.split(".", 1)
        if not isinstance(table.get(section), dict) or name not in table[section]:
            continue
        if any(p == sub or p.startswith(sub + ".") for p in set_paths):
            continue                       # the same overrides fill it: keep it
        del table[section][name]
        if notes is not None:
            why = [text for text, p in zip(overrides, set_paths) if p.split(".")[0] == section
                   and p.count(".") == 1 and p.split(".")[1] in SELECTORS]
            notes.append(f"[{sub}] is left out: after --set {', --set '.join(why) or ' '.join(overrides)} no chosen "
                         f"component reads it")
    return table


SELECTORS = ("dataset", "partition", "name") + POLICY_SLOTS   # keys that choose a component


def chosen_tables(table: dict) -> set[str]:
    """The component sub-tables a parsed job's choices read ("data.dirichlet", "model.mlp",
    "algorithm.gsnr"), resolved as :func:`from_dict` resolves presets and defaults."""
    def section(name):
        v = table.get(name)
        return v if isinstance(v, dict) else {}

    out = set()
    data, model, alg = section("data"), section("model"), section("algorithm")
    for key, default in (("dataset", DataSection.dataset), ("partition", DataSection.partition)):
        if isinstance(data.get(key, default), str):
            out.add(f"data.{table_name(data.get(key, default))}")
    if isinstance(model.get("name", ModelSection.name), str):
        out.add(f"model.{table_name(model.get('name', ModelSection.name))}")
    preset = PRESETS.get(alg.get("name", "fedavg"), {}) if isinstance(alg.get("name", "fedavg"), str) else {}
    slots = {**preset, **{k: alg[k] for k in POLICY_SLOTS if k in alg}}
    slots.setdefault("steps", "fixed" if alg.get("local_steps") else "epochs")
    out |= {f"algorithm.{v}" for v in slots.values() if isinstance(v, str) and v in registry.OPTIONS}
    return out


def _split(table: dict, cls) -> tuple[dict, dict]:
    """Separate a section's own keys from its component sub-tables."""
    own = {f.name for f in dataclasses.fields(cls)}
    plain, subs = {}, {}
    for k, v in (table or {}).items():
        if isinstance(v, dict) and k not in own:
            subs[k] = v
        else:
            plain[k] = v
    return plain, subs


def from_dict(table: dict, job_dir=None) -> Config:
    """Validate a parsed job and build the :class:`Config`; raises ConfigError listing every problem.

    One pass finds every problem: a section with a bad key is still built from its valid
    keys (defaults for the rest), so its components and the checks across sections run
    too; only checks that read a refused value wait until it is fixed. ``job_dir``: the job
    file's folder (or a list of folders), where plug-in modules (``model.name = "nets:SmallCNN"``)
    are looked for after ``sys.path``, before the current folder.
    """
    registry.check_plugins()   # $HPCFL_ALGORITHMS: a module that failed to import is the job's problem
    search = [job_dir] if isinstance(job_dir, (str, os.PathLike)) else list(job_dir or ())
    problems: list[str] = []
    known = {"run", "data", "model", "algorithm", "runtime", "system", "checkpoint", "guard", "watchdog", "results",
             "paper"}
    for k, v in table.items():
        if k == "sweep":   # a grid of jobs, not one job: hpcfl sweep expands it and runs every point
            problems.append(SWEEP_REFUSED)
        elif k == "paper":   # the paper's figures a paper job quotes: checked here, not part of the run
            problems += paper.read(v)[1]
        elif k not in known:
            problems.append(f"unknown section [{k}]; valid sections: {', '.join(sorted(known))}")
        elif not isinstance(v, dict):
            problems.append(f"{k} must be a table ([{k}]), found {v!r}")
    t = {k: v for k, v in table.items() if isinstance(v, dict)}

    run = build(RunSection, t.get("run"), "run", problems)
    data_plain, data_subs = _split(t.get("data"), DataSection)
    data, data_bad = build_partial(DataSection, data_plain, "data", problems)
    model_plain, model_subs = _split(t.get("model"), ModelSection)
    model, model_bad = build_partial(ModelSection, model_plain, "model", problems)
    alg_table, alg_subs = _split(t.get("algorithm"), AlgorithmSection)
    preset = alg_table.get("name", "fedavg")
    for slot, value in (PRESETS.get(preset, {}) if isinstance(preset, str) else {}).items():
        alg_table.setdefault(slot, value)
    alg_table.setdefault("local", "sgd")
    alg_table.setdefault("weights", "size")
    alg_table.setdefault("server", "average")
    alg_table.setdefault("steps", "fixed" if alg_table.get("local_steps") else "epochs")
    if alg_table["local"] == "prox":      # FedProx runs without a mu of its own: the papers' 0.01
        alg_table.setdefault("mu", registry.PROX_MU)
    algorithm, alg_bad = build_partial(AlgorithmSection, alg_table, "algorithm", problems)
    runtime = build(RuntimeSection, t.get("runtime"), "runtime", problems)
    from ..system import SystemOptions   # here for the same reason as in component_options

    system = build(SystemOptions, t.get("system"), "system", problems)
    extra = {name: build(cls, t.get(name), name, problems) for name, cls in
             (("checkpoint", CheckpointSection), ("guard", GuardSection), ("watchdog", WatchdogSection),
              ("results", ResultsSection))}
    policy_options = {}
    chosen = {slot: getattr(algorithm, slot) for slot in POLICY_SLOTS if slot not in alg_bad}
    for name in alg_subs:
        if len(chosen) == len(POLICY_SLOTS) and (name not in chosen.values() or name not in registry.OPTIONS):
            problems.append(f"[algorithm.{name}] is given but no chosen policy of that name takes options "
                            f"({', '.join(f'{k} = {v!r}' for k, v in chosen.items())}); rename or drop it")
    for slot, name in chosen.items():
        if name in registry.OPTIONS:
            opts = build(registry.OPTIONS[name], alg_subs.get(name), f"algorithm.{name}", problems)
            if opts is not None:
                policy_options[slot] = opts

    dataset_options = partition_options = model_options = None
    clashes = table_clashes(data, model, data_bad, model_bad)
    problems += clashes
    if "dataset" not in data_bad:
        dataset_options = component_options("dataset", data.dataset, data_subs, "data", problems, search)
    if "partition" not in data_bad:
        partition_options = component_options("partition", data.partition, data_subs, "data", problems, search)
    if not data_bad & {"dataset", "partition"} and not clashes:
        for name in data_subs:
            if name not in (table_name(data.dataset), table_name(data.partition)):
                problems.append(
                    f"[data.{name}] is given but data.dataset = {data.dataset!r} and data.partition = "
                    f"{data.partition!r}; rename the table or choose that component"
                )
    if "name" not in model_bad:
        model_options = component_options("model", model.name, model_subs, "model", problems, search)
        for name in model_subs:
            if name != table_name(model.name):
                problems.append(f"[model.{name}] is given but model.name = {model.name!r}" + (
                    f", whose options are [model.{table_name(model.name)}]" if is_plugin(model.name) else "") +
                    "; rename the table")
    if "num_clients" not in data_bad and "clients_per_round" not in alg_bad \
            and algorithm.clients_per_round > data.num_clients:
        problems.append(
            f"algorithm.clients_per_round = {algorithm.clients_per_round} exceeds data.num_clients = "
            f"{data.num_clients}; lower it (0 means all clients)"
        )
    if problems:
        raise ConfigError(problems)
    return Config(run, data, model, algorithm, runtime, dataset_options, partition_options, model_options,
                  policy_options, system, **extra)


def load(job, overrides: list[str] | None = None, files: bool = False) -> Config:
    """Read a job (see :func:`read_any`: a file's path, TOML text or a dict), apply ``--set``
    overrides and validate.

    The job must name its data and model: a job without ``[data]`` or ``[model]`` (an
    empty one, say) is refused rather than run on the defaults. What the overrides decided
    (a component table left out) is in ``Config.notes``. ``files``: also check that the
    dataset's files are where the job says (``hpcfl run``), reported with the other problems.
    """
    notes: list[str] = []
    table, what, job_dir = read_any(job)
    table = apply_overrides(table, list(overrides or []), notes)
    missing = [name for name in ("data", "model") if name not in table]
    found = data_file_problems(table) if files else []
    try:   # a job file's folder is where its plug-ins are looked for; a dict or TOML text has none
        cfg = from_dict(table, job_dir if what.startswith("job file") else None)
    except ConfigError as exc:
        raise ConfigError(missing_tables(what, missing) + exc.problems + found) from None
    if missing or found:
        raise ConfigError(missing_tables(what, missing) + found)
    return dataclasses.replace(cfg, job_dir=str(job_dir), notes=tuple(notes))


def data_file_problems(table: dict) -> list[str]:
    """Where the job's dataset files should be but are not (``DatasetSpec.files``), read from
    the raw job so that a job with other problems is checked too; values the job gets wrong
    are left to :func:`from_dict`'s messages."""
    from .. import data

    section = table.get("data")
    if not isinstance(section, dict):
        return []
    name, root = section.get("dataset"), section.get("root")
    spec = data.DATASETS.get(name) if isinstance(name, str) else None
    if spec is None or spec.files is None or not (root is None or isinstance(root, str)):
        return []
    sub = section.get(name)
    options, _ = build_partial(spec.options, sub if isinstance(sub, dict) else None, f"data.{name}", [])
    return spec.files(options, root)


def changed_keys(old: dict, new: dict) -> list[str]:
    """Dotted keys whose values differ between two ``Config.to_dict()`` dicts.

    A key the stored job ``old`` lacks is no change when ``new`` leaves it at its section
    default: a newer hpcfl added it, and it behaves as before.
    """
    a, b = flatten(old), flatten(new)
    defaults = flatten(sections.defaults())
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)
                  and not (k not in a and k in defaults and b[k] == defaults[k]))


SCHEDULE_KEYS = ("algorithm.lr_milestones", "algorithm.lr_milestone_rounds")


def resume_changes(old: dict, new: "Config") -> tuple[list[str], str | None]:
    """(changed keys, schedule problem or None) between a stored job and a resuming one.

    Changed keys as :func:`changed_keys` finds them, but the lr milestones are compared
    as the rounds they resolve to, so giving the
    same schedule in rounds instead of fractions is no change; a different resolved
    schedule (a new ``run.rounds`` moves fractional milestones) is a problem with the
    exact ``--set`` that keeps the original one.
    """
    changed = changed_keys(old, new.to_dict())
    if not any(k.startswith("algorithm.lr_") or k == "run.rounds" for k in changed):
        return changed, None
    alg = {**sections.defaults()["algorithm"], **old.get("algorithm", {})}   # stored jobs omit None keys
    rounds = old.get("run", {}).get("rounds", new.run.rounds)
    before = milestone_rounds(alg["lr_schedule"], alg["lr_milestones"], alg["lr_milestone_rounds"], rounds)
    now = milestone_rounds(new.algorithm.lr_schedule, new.algorithm.lr_milestones, new.algorithm.lr_milestone_rounds,
                           new.run.rounds)
    if before == now:
        return [k for k in changed if k not in SCHEDULE_KEYS], None
    if alg["lr_schedule"] != new.algorithm.lr_schedule or alg["lr_gamma"] != new.algorithm.lr_gamma:
        return changed, None   # a different schedule altogether: reported as a changed key
    problem = (f"the lr milestones would move from rounds {list(before)} to {list(now)} (the lr drops after that many rounds; "
               f"run.rounds {rounds} -> {new.run.rounds})")
    if before:
        problem += (f". To keep the schedule of the original run, add --set algorithm.lr_milestone_rounds="
                    f"[{','.join(map(str, before))}]")
    return [k for k in changed if k not in SCHEDULE_KEYS], problem + "; to change it, start a new run " \
        "(another --out, or --force)"


def is_safe_change(key: str) -> bool:
    return any(key == s or (s.endswith(".") and key.startswith(s)) for s in SAFE_TO_CHANGE)
