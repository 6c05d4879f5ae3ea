"""The assembly of a pipeline from its config (`Pipeline`, shared by the CLI and Dagster),
and the continuous mode that runs batches back to back.
"""
