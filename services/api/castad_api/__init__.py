"""The REST gateway: accepts briefs, publishes pipeline.requested, serves its projection."""
