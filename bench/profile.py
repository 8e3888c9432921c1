"""`make profile`: where each Castad process spends its CPU under the throughput run, by py-spy.

Starts the benchmark's installation (instant providers, every service its own process), samples
every service with `py-spy record` (raw collapsed stacks of the thread holding the GIL: the Python code at work) while
`--pipelines` briefs run through, and prints for each service the functions with the largest
share of its samples, by self time and inclusive. The collapsed stacks stay in
var/bench/profile/<service>.txt for a flame graph (https://github.com/brendangregg/FlameGraph or
speedscope.app both read them).
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import signal
import subprocess
import sys
import time

from castad_testkit import scratch

from bench import castad_bench

OUT = scratch.REPO_ROOT / "var" / "bench" / "profile"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--pipelines", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25, help="functions shown per service")
    parser.add_argument(
        "--native",
        action="store_true",
        help="C frames too: time in C extensions (psycopg's, pydantic's) is put where it is spent, not on the"
        " Python line that called into them; py-spy then stops each process at every sample, so take fewer",
    )
    return parser.parse_args(argv)


def _frame(frame: str) -> str:
    """`function (path/to/module.py:line)` -> `function (module.py)`."""
    name, _, where = frame.partition(" (")
    return f"{name} ({pathlib.Path(where.rstrip(')').split(':')[0]).name})" if where else name


def summarize(path: pathlib.Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [_frame(frame) for frame in stack.split(";")[1:]]  # the first one is the thread
        total += count
        if frames:
            own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{path.stem}: {total} samples"]
    for title, counter in (("self", own), ("inclusive", inclusive)):
        lines.append(f"  by {title}:")
        lines += [f"    {100 * n / max(total, 1):5.1f}%  {frame}" for frame, n in counter.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    workdir = (scratch.REPO_ROOT / "var" / "bench" / scratch.RUN_ID).resolve()
    cleanup = scratch.Cleanup()
    samplers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with scratch.interrupt_on_sigterm():
            bench = castad_bench.CastadBench(cleanup, workdir)
            bench.setup()
            bench.start()
            bench.sequential(5, first=0)  # warm
            assert bench.stack is not None
            for name, process in bench.stack.processes.items():
                command = ["py-spy", "record", "--format", "raw", "--rate", str(args.rate), "--gil"]
                command += ["--native"] if args.native else ["--nonblocking"]
                command += ["-p", str(process.pid), "-o", str(OUT / f"{name}.txt")]
                samplers[name] = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
            result = bench.throughput(args.pipelines, args.concurrency, first=5, count_commits=False)
    finally:
        for sampler in samplers.values():
            sampler.send_signal(signal.SIGINT)
        for sampler in samplers.values():
            sampler.wait(30)
        cleanup.run()
    print(f"{result['rate']:.1f} pipelines/s; CPU ms per pipeline: {result['cpu_ms_per_pipeline']}")
    for name in samplers:
        print(summarize(OUT / f"{name}.txt", args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
