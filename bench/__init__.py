"""Benchmark harness: Castad with instant providers vs a plain Dramatiq pipeline, and the NOTIFY question.

`make bench` (= `python -m bench.run`) runs everything against the local PostgreSQL and
RabbitMQ in databases, queues and processes of its own, and rewrites docs/reports/benchmarks.md.
"""
