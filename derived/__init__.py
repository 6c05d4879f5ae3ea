"""Derived outputs maintained in the same checkpoint as the raw table (issue 14).

The building blocks only: what an output is (`spec`), the batch's partial computed by the
stage (`partials`), and the idempotent commit of a partial into the output's Delta table
(`merge`), and the same for a PostgreSQL table by batch-id compare-and-set (`postgres`).
docs/derived-tables.md describes how they are wired into the protocol.
"""
