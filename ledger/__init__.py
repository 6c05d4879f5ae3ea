"""The commit ledger, the lowest layer: nothing here imports an edge, a job or Dagster.

- `core/`: the protocol core, pure (states, batch, invariant checks, decisions, backfill and
  topic planning, cleaning rules, the vote check, the storage layout and the ports);
- `host/`: which process owns an attempt (the host's process table);
- `coordinator/`: the two-phase commit of one batch, recovery, acks, decisions and backfills
  applied, through the ports only;
- `store/`: the SQLAlchemy ledger (SQLite or PostgreSQL), the port the coordinator is given.

docs/protocol.md is the contract these modules keep; pyproject.toml's import-linter contracts
keep the layering.
"""
