"""What the tests share besides fixtures (those are in tests/conftest.py and each folder's conftest.py).

- `servers`: where the tests' PostgreSQL and RabbitMQ are, and the failure when one is missing.
- `installation`: an isolated Castad (databases made on first use, a broker namespace, a folder for files).
- `object_store`: a real S3-compatible server for the session.
- `links`: the tests' link secret and the signed links made with it.
- `waits`: the one way to wait for something to become true.
- `network`: the three network providers' local fakes and the settings that send the stages to them.
- `scheduling`: how `make test` hands the tests to its pytest-xdist workers.

The brief factory is `castad_testkit.briefs`, which the benchmarks and the fault harness share.
"""
