"""The publisher port over Delta (and PostgreSQL): the table, the quarantine and every derived
output published in one checkpoint, idempotent by batch id.
"""
