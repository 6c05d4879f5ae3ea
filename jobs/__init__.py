"""What runs a batch's work: the Spark stage job, the edge adapters the protocol core talks to
(Kafka offsets, the Spark stager, the Delta publisher), and their assembly per pipeline config
(`jobs/wiring/pipeline.py`). The CLI and Dagster both go through `Pipeline`, so they run one code
path.
"""
