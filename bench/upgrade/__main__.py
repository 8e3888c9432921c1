"""`make upgrade-test` (`python -m bench.upgrade`).

A rolling upgrade from an earlier release (`--from`: a tag or a commit; by default the newest release tag, or
0.2.0's last commit before releases were tagged) to this working tree, then docs/reports/upgrade.md; exit status 1
on any finding (its measurements kept in upgrade.json beside it; `--render` writes the page again from them).
`--short` runs the version `make test` runs (one replica of every service, a few seconds per mix).
Logs of the services stay in var/upgrade/runs/<run id>/logs when the run found anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import shutil
import sys

from castad_testkit import scratch

from bench.upgrade import releases, report, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upgrade", description=__doc__)
    parser.add_argument("--from", dest="old", default=None, help="the release to upgrade from (a tag or a commit)")
    parser.add_argument("--short", action="store_true", help="the short version of `make test`")
    parser.add_argument("--render", action="store_true", help="write the page again from upgrade.json, run nothing")
    parser.add_argument("--output", type=pathlib.Path, default=scratch.REPORTS / "upgrade.md")
    args = parser.parse_args(argv)
    if args.render:
        args.output.write_text(report.render(json.loads(args.output.with_suffix(".json").read_text())))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("bench").setLevel(logging.INFO)
    workdir = (releases.PLACE / "runs" / scratch.RUN_ID).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with scratch.interrupt_on_sigterm():
            result = run.run(args.old or releases.previous(), run.SHORT if args.short else run.FULL, workdir)
    except KeyboardInterrupt:
        scratch.log.error("interrupted; cleaned up; logs in %s", workdir)
        return 1
    report.write(result, args.output)
    for finding in result.findings:
        print(f"finding: {finding}", file=sys.stderr)
    if result.findings:
        scratch.log.error("%d findings; logs in %s; report %s", len(result.findings), workdir, args.output)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    scratch.log.info("no findings; wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
