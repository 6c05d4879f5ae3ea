"""`exactly bench`: this product against Spark Structured Streaming and the machine's limits.

Everything is measured in one run, on one data set, on the same machine, so the figures can be
compared with each other (and only with each other: the machine is shared, and absolute
figures move with its load). Modules:

    data.py      the embedded broker's topic: a fixed page-view data set
    product.py   this product, through the CLI code path and through a Dagster run
    cached_plan.py  a stage plan cached across batches, compared with the one in use
    peer.py      Spark Structured Streaming, Kafka source to Delta sink, trigger AvailableNow
    limits.py    the raw consume rate of the topic and pyarrow's Parquet write rate
    commits.py   delta-rs commit latency against file count and against table history
    report.py    medians over repetitions, ratios, the printed table and the JSON
    harness.py   one whole run, with every broker and Spark session stopped at the end
    daemon.py    runs launched by the Dagster daemon (`--only daemon`), against the CLI path
"""
