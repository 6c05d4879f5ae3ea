"""Kafka: the client (`client.KafkaClient`, assembled from the connection and its error
translation, topic admin and offsets, consumer-group offsets and producing), topic selection
by list or pattern, and the embedded KRaft broker (with its test CA) started on loopback as
the default cluster.

An edge: may import `ledger.core` and `resources.jvm`; never a job or the coordinator.
"""
