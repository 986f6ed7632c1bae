"""Anyone's catalog: the directory format (:mod:`.format`) and its build into features and units (:mod:`.build`).

See ``docs/own-data.md`` ("Your own catalog") for the format; :func:`build_catalog` is the entry point.
"""

from .build import BuiltCatalog, TagFeaturizer, build_catalog, hash_unit
from .format import CatalogFormatError, read_events

__all__ = ["BuiltCatalog", "TagFeaturizer", "build_catalog", "hash_unit", "CatalogFormatError", "read_events"]
