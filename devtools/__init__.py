"""Launchers for development and tests: the embedded Kafka broker and a Spark Connect server.

Kept apart from `resources/`, which holds only what a production run touches: a production
pipeline talks to a Kafka cluster and a Spark master someone else runs, never to a JVM this
package started. `exactly kafka`, the demo, the benchmark and the tests use these launchers.
"""
