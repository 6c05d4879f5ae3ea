"""Contract tests: one set of behavioural tests run against a fake edge of the coordinator
(tests/fixtures/fakes.py) and the real one it stands for, so the fake cannot drift."""
