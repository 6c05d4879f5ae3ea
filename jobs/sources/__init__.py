"""The offset source port over Kafka: one topic, or several by list or pattern."""
