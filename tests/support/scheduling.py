"""How `make test` hands the tests to its pytest-xdist workers (`-n 4 --dist loadscope`)."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

END_TO_END = "tests/e2e/"
# End-to-end modules that assert no timing, most starting a stack of their own (reviews and remakes share one, the
# worker's): one worker runs them in turn beside the others (about 270 s on the 2-core host). The fault suite, which
# measures how soon work is taken over, comes last in the other unit; in clean runs this one and the rest were over
# by then, though nothing waits for them: on a slower host the fault suite may start beside their last tests.
BESIDE = tuple(
    f"{END_TO_END}test_{name}.py"
    for name in (
        "api_fuzz",
        "languages",
        "network_providers",
        "secrets",
        "object_store",
        "read_side",
        "tracing",
        "retention",
        "slideshow",
        "reviews",
        "remakes",
        "usage",
    )
)


class EndToEndInTurn(LoadScopeScheduling):
    """The end-to-end tests as two units of work, each run one after another by one worker; every other test alone.

    xdist hands the largest units out first, so both start at once while the other workers share the rest.
    (`--dist loadgroup` would do it with a marker, but its xdist 3.8 names the group in a way pytest 9.2's node
    ids no longer carry.)
    """

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(BESIDE):
            return f"{END_TO_END} beside"
        return END_TO_END if nodeid.startswith(END_TO_END) else nodeid
