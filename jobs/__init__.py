"""The batch's jobs: the Spark stage (`stage/`, with the `format:` decoders in `formats/`), the
offset sources (`sources/`), the publisher of the table, the quarantine and derived outputs
(`publish/`, `derived/`), the cleaner (`maintenance/`), and the pipeline's wiring shared by
the CLI and Dagster (`wiring/`, `Pipeline`), plus example transforms (`examples/`).

May import `resources` and `ledger`; never `orchestration` or the CLI.
"""
