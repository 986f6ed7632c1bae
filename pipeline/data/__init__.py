"""What flows: the item catalogs and the records of the public topics.

Modules
-------
catalog       item catalogs: who the users are, which unit models them, each arm's features
              (synthetic, LastFM, or a catalog directory), and ``load_catalog``
catalog_base  the catalog protocol and the lookups every catalog shares, the lookup errors
catalog_open  a catalog directory (:mod:`producers.catalog`) as a pipeline catalog
records       record types of the public topics and the strict parser of ``interactions`` events
"""

__all__ = ["catalog", "catalog_base", "catalog_open", "records"]
