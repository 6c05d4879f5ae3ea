"""The stage: one Spark job reads the batch's offset ranges, transforms, checks every
coordinate, and writes the table's, the quarantine's and the derived partials' files.
"""
