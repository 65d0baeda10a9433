"""Components of your own: ``"module.path:attribute"`` in ``model.name``, ``data.dataset`` or
``data.partition`` names a callable in your code instead of a built-in.

A name with a ``:`` is a plug-in; any other name is a built-in, as before. :func:`resolve` imports
the module and returns a :class:`Plugin`: the callable, the options dataclass generated from its
signature, and where its code came from (file and SHA-256, recorded in results.h5).

Where the module is looked for: Python's ``sys.path`` as usual (``PYTHONPATH``, the installed
packages), then the current folder and the job file's folder. Those two are appended to ``sys.path``
(when not there already), so an installed package of the same name wins, and a module that imports
a sibling file later still finds it.

Options. A plug-in takes its options from the sub-table named after its attribute, as a built-in
takes them from the one named after itself: ``model.name = "nets:SmallCNN"`` reads ``[model.SmallCNN]``,
``data.dataset = "mydata:load"`` reads ``[data.load]``. The schema is the callable's parameters after
its fixed leading ones (:data:`FIXED`): each parameter's type is its annotation when that is
``int``, ``float``, ``bool``, ``str``, ``list[...]``/``tuple[..., ...]`` of one of those, or one of
those ``| None``; else the type of its default. A parameter without a default is a required key. The
options are checked by :func:`hpcfl.config.options.build`, exactly as a built-in's are. A list option
reaches a parameter annotated ``list[...]`` as a list, any other as a tuple.

This module imports neither torch nor numpy: reading a job needs it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import os
import sys
import sysconfig
import traceback
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, nearest

# The selector key of each kind and the leading parameters its callable takes before the options.
KEYS = {"model": "model.name", "dataset": "data.dataset", "partition": "data.partition"}
FIXED = {"model": ("input_shape", "num_classes"), "dataset": ("seed",),
         "partition": ("labels", "num_clients", "seed")}
CONTRACTS = {
    "model": "YourModel(input_shape: tuple[int, ...], num_classes: int, **options) -> torch.nn.Module",
    "dataset": "load(seed: int, **options) -> a mapping with x, y, x_test, y_test",
    "partition": "split(labels, num_clients: int, seed: int, **options) -> num_clients index arrays",
}
_BASE = (int, float, bool, str)
_NAMES = {"int": int, "float": float, "bool": bool, "str": str}   # string annotations without get_type_hints
PLUGIN_ATTR = "__hpcfl_plugin__"   # on a generated options class: the Plugin it belongs to


@dataclass(frozen=True)
class Plugin:
    """A resolved plug-in.

    Attributes
    ----------
    name : str
        As the job gives it, ``"module.path:attribute"``.
    kind : str
        ``"model"``, ``"dataset"`` or ``"partition"``.
    obj : callable
        The attribute (a class or function).
    options : type
        Frozen options dataclass generated from ``obj``'s parameters (see the module docstring).
    file : str or None
        The module's source file (None for a module without one).
    sha256 : str or None
        SHA-256 of that file's bytes.
    doc : str
        First line of ``obj``'s docstring, or a line naming the file.
    """

    name: str
    kind: str
    obj: typing.Callable
    options: type
    file: str | None
    sha256: str | None
    doc: str

    @property
    def key(self) -> str:
        return KEYS[self.kind]

    @property
    def label(self) -> str:
        """How messages name it: ``model.name = 'nets:SmallCNN'``."""
        return f"{self.key} = {self.name!r}"

    def call(self, options, *fixed):
        """``obj(*fixed, **options)``, the options as keyword arguments (lists where annotated so)."""
        kwargs = {}
        for f in dataclasses.fields(options):
            value = getattr(options, f.name)
            kwargs[f.name] = list(value) if f.metadata.get("as_list") and value is not None else value
        return self.obj(*fixed, **kwargs)

    def provenance(self) -> dict:
        """What results.h5 records of it (``plugins`` attribute)."""
        return {"name": self.name, "file": self.file, "sha256": self.sha256}


def is_plugin(name) -> bool:
    """Whether a component name names user code (``"module:attribute"``)."""
    return isinstance(name, str) and ":" in name


def table_name(name) -> str:
    """The sub-table a component reads its options from: its own name, or a plug-in's attribute."""
    return name.rsplit(":", 1)[1] if is_plugin(name) else name


def of(options) -> Plugin | None:
    """The plug-in an options object was generated for, or None (a built-in's options)."""
    return getattr(type(options), PLUGIN_ATTR, None)


def split_name(name: str, key: str) -> tuple[str, str]:
    """``"a.b:C"`` -> ("a.b", "C"); ConfigError unless both halves are Python names."""
    module, _, attr = name.partition(":")
    if not (all(p.isidentifier() for p in module.split(".")) and attr.isidentifier()):
        raise ConfigError(f"{key} = {name!r} is not of the form \"module.path:attribute\" (Python names on both "
                          f"sides of one ':', e.g. {key} = \"nets:SmallCNN\"); fix the name")
    return module, attr


def resolve(kind: str, name: str, search=()) -> Plugin:
    """Import plug-in ``name`` of ``kind`` and build its options class.

    Parameters
    ----------
    kind : str
        A key of :data:`KEYS`.
    name : str
        ``"module.path:attribute"``.
    search : iterable of str or Path
        Folders to look in after ``sys.path``, before the current folder (the job file's folder).

    Raises
    ------
    ConfigError
        The module cannot be imported (or raises while importing), has no such attribute, the
        attribute is not callable, or its signature does not fit the contract; every message names
        the key, the module and the fix.
    """
    key = KEYS[kind]
    module_name, attr = split_name(name, key)
    module = import_module(module_name, f"{key} = {name!r}", search)
    file = getattr(module, "__file__", None)
    if not hasattr(module, attr):
        public = sorted(n for n in dir(module) if not n.startswith("_"))
        guess = next((n for n in public if n.lower() == attr.lower()), None) or nearest(attr, public)
        where = f" ({file})" if file else ""
        hint = (f"did you mean {module_name}:{guess}?" if guess else
                f"its public names: {', '.join(public[:12])}{' ...' if len(public) > 12 else ''}" if public else
                "it defines no public names")
        raise ConfigError(f"{key} = {name!r}: module {module_name!r}{where} has no attribute {attr!r}; {hint}")
    obj = getattr(module, attr)
    if not callable(obj):
        raise ConfigError(f"{key} = {name!r}: {module_name}.{attr} = {obj!r:.40} is not callable; name a class or "
                          f"function of the form {CONTRACTS[kind]}")
    plugin = Plugin(name, kind, obj, object, file, _sha256(file), _doc(obj, file))
    plugin = dataclasses.replace(plugin, options=options_class(plugin))
    setattr(plugin.options, PLUGIN_ATTR, plugin)   # of(options) finds the callable from the options alone
    return plugin


def search_folders(search=()) -> list[tuple[str, str]]:
    """(what, folder) looked in after ``sys.path``: ``search`` (the job file's folder), then the current one."""
    out, seen = [], set()
    for what, d in [*(("the job file's folder", d) for d in search), ("the current folder", os.getcwd())]:
        d = str(Path(d).resolve()) if d else None
        if d and d not in seen:
            seen.add(d)
            out.append((what, d))
    return out


JOB_FIX = "put {top}.py (or the package folder {top}/) next to the job file, or its folder on PYTHONPATH"


def import_module(module_name: str, label: str, search=(), fix: str = JOB_FIX):
    """Import ``module_name`` searching ``sys.path``, then :func:`search_folders` (appended to sys.path).

    ``label`` starts every message (``model.name = 'nets:SmallCNN'``, ``$HPCFL_ALGORITHMS``), ``fix``
    ends the one of a module not found (``{top}``: the module's top-level name). A module that is not
    found and a module that raises while importing are ConfigErrors of one line each: the first names
    where it looked and the fix, the second the exception and the line of the module's code that
    raised it.
    """
    folders = search_folders(search)
    for _, d in folders:
        if d not in sys.path:
            sys.path.append(d)
    importlib.invalidate_caches()   # a module written since the last import in this process
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        parts = module_name.split(".")
        if missing in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:   # the module itself
            where = ", then ".join(f"{what} {d}" for what, d in folders)
            raise ConfigError(
                f"{label}: module {module_name!r} cannot be imported (ModuleNotFoundError: No module named "
                f"{missing!r}); looked in sys.path (PYTHONPATH and the installed packages), then {where}. Fix: "
                f"{fix.format(top=parts[0])}") from None
        raise ConfigError(f"{label}: importing module {module_name!r} raised {raised_at(exc)}; fix the module "
                          f"(python -c \"import {module_name}\" shows the whole traceback)") from None
    except (Exception, SystemExit) as exc:   # the user's code ran and failed: its line, not our traceback
        raise ConfigError(f"{label}: importing module {module_name!r} raised {raised_at(exc)}; fix the module "
                          f"(python -c \"import {module_name}\" shows the whole traceback)") from None


def raised_at(exc: BaseException) -> str:
    """``ZeroDivisionError: division by zero (at /x/nets.py:3)``: the exception and the innermost
    line of the traceback outside Python's import machinery and hpcfl, on one line."""
    text = " ".join(str(exc).split())
    what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename:   # the traceback ends in the import machinery
        return f"{type(exc).__name__}: {' '.join(str(exc.msg).split())} (at {exc.filename}:{exc.lineno})"
    here = str(Path(__file__).resolve().parent)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<") and not str(Path(f.filename).resolve()).startswith(here)]
    # the user's own line, not numpy's or the standard library's that it called, where there is one
    libs = tuple({str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "purelib", "platlib")})
    own = [f for f in frames if not str(Path(f.filename).resolve()).startswith(libs)] or frames
    return f"{what} (at {own[-1].filename}:{own[-1].lineno})" if own else what


def _sha256(file: str | None) -> str | None:
    if not file:
        return None
    try:
        with open(file, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _doc(obj, file: str | None) -> str:
    lines = (inspect.getdoc(obj) or "").strip().splitlines()
    return lines[0] if lines else f"your {getattr(obj, '__qualname__', obj)!s} ({file or 'no file'})"


# ---- the options class ------------------------------------------------------------------------

def options_class(plugin: Plugin) -> type:
    """The frozen dataclass of ``plugin``'s options, from the parameters after its fixed ones."""
    kind, obj = plugin.kind, plugin.obj
    fixed = FIXED[kind]
    shown = f"{plugin.name.rsplit(':', 1)[1]}"
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        raise ConfigError(f"{plugin.label}: its parameters cannot be read (inspect.signature fails); name a plain "
                          f"class or function of the form {CONTRACTS[kind]}") from None
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_rest = any(p.kind is p.VAR_POSITIONAL for p in params)
    if len(positional) < len(fixed) and not takes_rest:
        raise ConfigError(f"{plugin.label}: {shown}{sig} takes {len(positional)} positional parameter(s); the "
                          f"contract is {CONTRACTS[kind]} (the first {len(fixed)}: {', '.join(fixed)}); fix its "
                          f"parameters")
    hints = _hints(obj)
    fields = []
    for p in params[len(fixed):] if len(positional) >= len(fixed) else []:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            continue   # not settable by name
        tp, as_list = _option_type(hints.get(p.name, p.annotation), p.default)
        if tp is None:
            raise ConfigError(f"{plugin.label}: parameter {p.name!r} of {shown}{sig} has no option type; annotate it "
                              f"as int, float, bool, str or list[...] of one of these (e.g. {p.name}: int = 8), or "
                              f"give it a default of one of these types")
        meta = {"help": f"parameter {p.name} of {plugin.name}", "as_list": as_list}
        if p.default is p.empty:
            fields.append((p.name, tp, dataclasses.field(metadata=meta)))
            continue
        default = _default(plugin, p.name, p.default, tp)
        fields.append((p.name, tp, dataclasses.field(default=default, metadata=meta)))
    cls = dataclasses.make_dataclass(f"{shown}Options", fields, frozen=True, kw_only=True,
                                     namespace={PLUGIN_ATTR: None, "__doc__": f"Options of {plugin.name}."})
    cls.__module__ = __name__
    return cls


def _hints(obj) -> dict:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return typing.get_type_hints(target)
    except Exception:   # an annotation naming what is not importable here: fall back to the raw ones
        return {}


def _option_type(ann, default):
    """(the dataclass field type, whether the parameter wants a list), or (None, False)."""
    if isinstance(ann, str):
        ann = _NAMES.get(ann.strip(), inspect.Parameter.empty)
    found = _annotated(ann)
    if found[0] is not None:
        return found
    if type(default) in _BASE:
        return type(default), False
    if isinstance(default, (list, tuple)) and default and len({type(v) for v in default}) == 1 \
            and type(default[0]) in _BASE:
        return tuple[type(default[0]), ...], isinstance(default, list)
    return None, False


def _annotated(ann):
    if ann in _BASE:
        return ann, False
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is list and len(args) == 1 and args[0] in _BASE:
        return tuple[args[0], ...], True
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and args[0] in _BASE:
        return tuple[args[0], ...], False
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and len(args) == 2:
            tp, as_list = _annotated(inner[0])
            if tp is not None:
                return typing.Optional[tp], as_list
    return None, False


def _default(plugin: Plugin, name: str, value, tp):
    """The parameter's default as the field's type (an int default of a float parameter: a float)."""
    try:
        return _fit(value, tp)
    except TypeError:
        raise ConfigError(f"{plugin.label}: the default {name} = {value!r} does not fit its annotation; make the "
                          f"default {name}'s type, or the annotation the default's") from None


def _fit(value, tp):
    """``value`` as ``tp`` (one of the option types of :func:`_annotated`), or TypeError; never rounds.
    The same rules as the job's values follow (hpcfl.config.options), for the few types a plug-in has."""
    if typing.get_origin(tp) is typing.Union:
        return None if value is None else _fit(value, typing.get_args(tp)[0])
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeError
        return tuple(_fit(v, typing.get_args(tp)[0]) for v in value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not tp:   # bool is not an int here, nor an int a bool
        raise TypeError
    return value


def defaults(cls) -> dict:
    """The fields of an options class that have a default, with it (required ones are left out)."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def folders_of(records: dict) -> list[str]:
    """Where the recorded plug-ins' modules were imported from (``plugins`` attribute of results.h5):
    for ``pkg.sub`` in ``/a/pkg/sub.py``, ``/a``. Lets a later reader build the model again."""
    out = []
    for rec in (records or {}).values():
        if not isinstance(rec, dict) or not isinstance(rec.get("file"), str) or not is_plugin(rec.get("name")):
            continue
        module = rec["name"].split(":", 1)[0]
        path = Path(rec["file"]).parent
        for _ in range(module.count(".") + (Path(rec["file"]).name == "__init__.py")):
            path = path.parent
        out.append(str(path))
    return out
