"""The pipeline's configuration: the strict YAML model, formats, partitioning, derived output
specs, schema files and transform loading. Validated once, read by every layer above.
"""
