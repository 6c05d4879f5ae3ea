"""Alert sinks: the webhook an operator is told through when a batch is stuck."""
