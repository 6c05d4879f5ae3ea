pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.postgres",
    "tests.fixtures.pipeline",
    "tests.fixtures.webhook",
]
