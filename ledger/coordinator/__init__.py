"""The coordinator: the two-phase commit of one batch, acks, recovery and rebuild, liveness
of an attempt's owner, operator decisions applied.

Drives the edges through the ports of `ledger.core.ports` only; may import `ledger.core`,
never `ledger.store` (the store is handed in) nor any edge (Kafka, Spark, Delta).
"""
