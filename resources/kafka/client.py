"""`KafkaClient`: everything the product asks of Kafka, for one cluster, as one object.

The operations live by concern: the connection, its waits and error translation
(resources/kafka/connection.py), topics and their offsets (topic_admin.py), consumer-group
offsets (group_offsets.py) and producing (producing.py). This class only puts them together,
so that callers hold one client per cluster and describe its security settings once.
"""

from __future__ import annotations

from resources.kafka.group_offsets import GroupOffsets
from resources.kafka.producing import Producing


class KafkaClient(GroupOffsets, Producing):
    """Kafka operations for one cluster, with clear errors and bounded waits.

    `options` (security settings, for example) are passed to every confluent client this
    object creates, so an authenticated cluster needs to be described only once. `timeout`
    bounds each single broker operation in seconds.
    """
