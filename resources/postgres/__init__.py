"""PostgreSQL derived outputs: a row table kept by batch-id compare-and-set in the same
checkpoint as the Delta table.
"""
