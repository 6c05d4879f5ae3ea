"""The runtime clients a production run touches: Kafka, Spark sessions, Delta tables,
storage locations, alert sinks, and the validated pipeline config. Launchers for development
and tests live in devtools/, not here.
"""
