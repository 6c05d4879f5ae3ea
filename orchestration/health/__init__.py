"""Dagster sensors and asset checks that tell an operator a pipeline's health: stuck batches,
failed runs, table and derived checks, liveness. Each calls a pure `decide_*` function.
"""
