"""`make upgrade-test` (`python -m bench.upgrade`).

A rolling upgrade from an earlier release (`--from`: a tag or a commit; by default the newest release tag, or
0.2.0's last commit before releases were tagged) to this working tree, then docs/reports/upgrade.md; exit status 1
on any finding (its measurements kept in upgrade.json beside it; `--render` writes the page again from them).
`--short` runs the version `make test` runs (one replica of every service, a few seconds per mix).
Logs of the services stay in var/upgrade/runs/<run id>/logs when the run found anything.
"""

from __future__ import annotations

import logging
import shutil
import sys

from castad_testkit import scratch

from bench import pages
from bench.upgrade import releases, report, run


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("upgrade", __doc__)
    parser.add_argument("--from", dest="old", default=None, help="the release to upgrade from (a tag or a commit)")
    parser.add_argument("--short", action="store_true", help="the short version of `make test`")
    args = parser.parse_args(argv)
    if args.render:
        pages.write(args.output, report.render)
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
    scratch.log.info("no findings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
