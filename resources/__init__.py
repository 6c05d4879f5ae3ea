"""The edges: one subpackage per external system (Kafka, Spark, the JVM, Delta, object
storage, PostgreSQL, alerts), the pipeline's validated config, and failures told in one line.

May import `ledger` (its core values and errors); never `jobs`, `orchestration` or the CLI.
The embedded services a run can start on loopback (the KRaft broker, a Spark Connect server, a
standalone cluster, an S3-compatible server) live with the system they stand in for.
"""
