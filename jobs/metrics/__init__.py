"""Metrics for Prometheus: a pipeline's figures read from its ledger and Kafka at each scrape
(collector.py), served over HTTP or written to a node-exporter text file (exposition.py)."""
