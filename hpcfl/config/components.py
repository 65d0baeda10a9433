"""The job's chosen components (``data.dataset``, ``data.partition``, ``model.name``) and their option
tables: a built-in's ``[model.mlp]``, a plug-in's ``[model.SmallCNN]`` (:mod:`hpcfl.plugins`)."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError
from ..plugins import is_plugin, table_name
from .options import build
from .sections import DataSection, ModelSection


def component_options(kind: str, name: str, subs: dict, where: str, problems: list[str], search=()):
    """Build the options of component ``name`` from its sub-table (a plug-in's: the one named after
    its attribute; its module looked for in ``search`` too, see :mod:`hpcfl.plugins`)."""
    # Imported here, not at the top: commands that import this module without reading a job
    # (hpcfl --help, report, plot) then skip the dataset, model and system modules.
    from .. import data, models

    lookup = {"dataset": data.dataset_options, "partition": data.partition_options, "model": models.model_options}
    try:
        cls = lookup[kind](name, search)
    except ConfigError as exc:
        problems += exc.problems
        return None
    return build(cls, subs.get(table_name(name)), f"{where}.{table_name(name)}", problems)


def table_clashes(data: DataSection, model: ModelSection, data_bad: set, model_bad: set) -> list[str]:
    """A plug-in's table that another component, or the section's own key, also owns."""
    own = {"data": {f.name for f in dataclasses.fields(DataSection)},
           "model": {f.name for f in dataclasses.fields(ModelSection)}}
    chosen = [("data", "data.dataset", data.dataset, "dataset" in data_bad),
              ("data", "data.partition", data.partition, "partition" in data_bad),
              ("model", "model.name", model.name, "name" in model_bad)]
    out = []
    for section, key, name, bad in chosen:
        if not bad and is_plugin(name) and table_name(name) in own[section]:
            out.append(f"{key} = {name!r} would take its options from [{section}.{table_name(name)}], but "
                       f"{section}.{table_name(name)} is a key of [{section}]; rename the function or class")
    if not data_bad & {"dataset", "partition"} and (is_plugin(data.dataset) or is_plugin(data.partition)) \
            and table_name(data.dataset) == table_name(data.partition):
        out.append(f"data.dataset = {data.dataset!r} and data.partition = {data.partition!r} would both take their "
                   f"options from [data.{table_name(data.dataset)}]; rename one of the two functions")
    return out
