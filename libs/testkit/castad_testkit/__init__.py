"""What the tests, the benchmarks and the fault harness share.

- `briefs`: the one brief factory.
- `scratch`: a run's id, where its reports go, the servers it uses, its scratch databases and its clean-up.
- `handoffs`: the chain of events a pipeline hands on, and the clock that times each event's commit.
- `latency`: percentiles and summaries of latency samples.
- `machine`: facts about the machine and the servers a run measured.
- `charts`: the reports' SVG charts, the same file from the same measurements.
"""
