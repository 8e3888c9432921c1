"""`make faults` (`python -m castad_faults`).

A fault run, then docs/reports/faults.md; exit status 1 on any finding.

`--short` runs the plan `make test` runs (every fault kind once, 6 s outages, the kills and the database outages
of every service at once). Logs of the
services stay in var/faults/<run id>/logs when the run found anything or failed.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import shutil
import sys

from castad_testkit import scratch

from castad_faults import outcome, plan, report, run

log = logging.getLogger("castad_faults")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m castad_faults", description=__doc__)
    parser.add_argument("--short", action="store_true", help="the short plan of `make test`")
    parser.add_argument("--output", type=pathlib.Path, default=scratch.REPORTS / "faults.md")
    parser.add_argument("--keep", action="store_true", help="leave the databases, queues and files of the run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    log.setLevel(logging.INFO)
    workdir = (scratch.REPO_ROOT / "var" / "faults" / scratch.RUN_ID).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with scratch.interrupt_on_sigterm():
            result = run.run(plan.SHORT if args.short else plan.FULL, workdir, keep=args.keep)
    except KeyboardInterrupt:
        log.error("interrupted; cleaned up; logs in %s", workdir)
        return 1
    report.write(result, args.output)
    for finding in result.findings:
        print(f"finding: {finding}", file=sys.stderr)
    if result.handoff_target_met is False:
        log.warning(
            "target missed: stage handoff p99 %.1f ms, over %g ms", result.handoff_p99_ms, outcome.HANDOFF_P99_MS
        )
    if result.findings:
        kept = f"; databases castad_faults_{scratch.RUN_ID}_* kept" if args.keep else ""
        log.error("%d findings; logs in %s; report %s%s", len(result.findings), workdir, args.output, kept)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    log.info("no findings; wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
