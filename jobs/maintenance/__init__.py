"""Maintenance: the cleaner of staged files no batch can still need."""
