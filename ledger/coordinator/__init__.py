"""The coordinator: the two-phase commit of one batch (two_phase.py, the one entry), acks
(acks.py), recovery and rebuild (recovery.py), a vote that lost files staged again
(restage.py), liveness of an attempt's owner (liveness.py), planning on several topics
(topics.py), operator decisions and backfills applied (decisions.py, backfill.py), what it
reports (reports.py), crash points (crash.py).

Drives the edges through the ports of `ledger.core.ports` only; may import `ledger.core`,
never `ledger.store` (the store is handed in) nor any edge (Kafka, Spark, Delta).
"""
