"""Delta Lake through delta-rs: the table, the one compare-and-set commit loop used by
publish, replace and MERGE, schemas, statistics, storage options, row rewrites, log reads
and compaction.

An edge: may import `ledger.core`, `resources.config` and `resources.object_storage`.
"""
