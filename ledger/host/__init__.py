"""This host as the ledger sees it: which process owns an attempt, and whether that process
is still the one that started it (Linux's process table).

Below the coordinator and the store (both record and read owners), above the pure core.
"""
