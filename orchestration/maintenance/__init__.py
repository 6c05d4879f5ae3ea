"""Dagster jobs and schedules for cleaning and compaction."""
