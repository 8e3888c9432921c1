"""How `make test` hands the tests to its pytest-xdist workers (`-n 4 --dist loadscope`)."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

END_TO_END = "tests/e2e/"


class EndToEndInTurn(LoadScopeScheduling):
    """The end-to-end tests as one unit of work, run one after another by one worker; every other test alone.

    xdist hands the largest unit out first, so the end-to-end tests, the longest run, start at once while the
    other workers share the rest. (`--dist loadgroup` would do it with a marker, but its xdist 3.8 names the group
    in a way pytest 9.2's node ids no longer carry.)
    """

    def _split_scope(self, nodeid: str) -> str:
        return END_TO_END if nodeid.startswith(END_TO_END) else nodeid
