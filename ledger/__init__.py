"""The commit ledger and the protocol core: batch states and planning rules (pure), the
two-phase commit of one batch (pure, edges as Protocols), and the durable store of batch
records. docs/protocol.md is the contract these modules keep.
"""
