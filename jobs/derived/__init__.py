"""Derived outputs' jobs: partials computed by the stage, replace and rebuild of an output,
and the invariants an output keeps. docs/derived-tables.md describes how they are wired in.
"""
