"""The protocol core: batch states and transitions, the batch record, invariant checks,
operator decisions, backfill and topic planning, cleaning rules, the vote check, the storage
layout and the ports the coordinator drives.

Pure: imports the standard library and itself, nothing else (an import-linter contract in
pyproject.toml keeps it so). docs/protocol.md is the contract these modules keep.
"""
