"""Dagster jobs, schedules and sensors that run batches: the next batch, a re-drive, a
backfill, the continuous mode."""
