"""The stage's job as its statements return it; the statements themselves are in this package's modules.

All the SQL on the jobs and attempts tables is here, by what it serves:

- `claiming`: a trigger that makes its job due, a claim under a lease (by fair turns or oldest first), the leases
  renewed or found expired, and the jobs not ended counted for the metrics;
- `attempts`: an attempt's work sent to its provider (fenced by its claim), its end, its wait at its provider;
- `operations`: an operator's cancel or retry, in the order the pipeline's requests came;
- `drafts`: a job whose draft waits for a person's review (castad_runtime.stage.reviews);
- `polls`: the prober's batches of jobs AWAITING their provider, and the provider's callbacks;
- `ended`: the jobs that ended, their files swept and then the jobs forgotten (castad_runtime.stage.retention).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any, TypeVar

from castad_contracts import events

from castad_runtime.stage import machine

P = TypeVar("P", bound=events.Payload)

# The columns of a claimed job, as the hot path's statements (castad_runtime.stage.repository.claiming) return them.
JOB_COLUMNS = """id, pipeline_id, status, version, attempts, counted_attempts, max_attempts, input, traceparent,
    tracestate, handle, submitted_at, polls, coalesce(extract(epoch FROM now() - submitted_at), 0) AS waited_s,
    reopened, previous_handle, extract(epoch FROM now() - previous_submitted_at) AS previous_waited_s, input_version,
    created_at, review"""


@dataclasses.dataclass(frozen=True)
class Job:
    id: uuid.UUID
    pipeline_id: str
    status: machine.Status
    version: int
    attempts: int  # attempts started, this one included: its number
    counted_attempts: int  # attempts charged against max_attempts before this one
    max_attempts: int
    input: dict[str, Any]
    traceparent: str | None
    tracestate: str | None
    handle: str | None = None  # the provider's id of the work this attempt submitted (AWAITING), if any
    submitted_at: dt.datetime | None = None
    polls: int = 0  # polls that found the provider's work unfinished
    waited_s: float = 0.0  # since the submit, by the database's clock at the claim
    reopened: int = 0  # operator retries that reopened the job (its runs, less the first)
    previous_handle: str | None = None  # the work an earlier attempt left at the provider, looked up first
    previous_waited_s: float | None = None  # since that work was submitted (None: not known, or no such work)
    input_version: int | None = None  # the version of the stage's trigger `input` is stored as (None: the newest)
    created_at: dt.datetime | None = None  # when the stage first heard of the job (None: not said)
    review: dict[str, Any] | None = None  # its draft and what a person decided (castad_runtime.stage.reviews)

    def trigger(self, model: type[P], registry: events.Registry = events.REGISTRY) -> P:
        """The job's input as `model`, the release's model of the stage's trigger.

        Read from the version it was stored as, through the same upcasts as an event of that version."""
        event_type = registry.type_of(model)
        version = self.input_version or registry.current_version(event_type)
        payload = registry.read(event_type, version, self.input)
        assert isinstance(payload, model)
        return payload

    @property
    def next_round(self) -> int:
        """The round of the job's next draft for a review: 0 for its first, one more than its last's after."""
        return self.review["round"] + 1 if self.review and "round" in self.review else 0

    @property
    def polling(self) -> bool:
        """The attempt has submitted its work to a provider: this claim asks how it goes."""
        return self.handle is not None

    @property
    def submission_key(self) -> str:
        """The key of the work this attempt sends to a provider (its idempotency key, or its tag).

        The same for every claim of one counted attempt: an attempt the machinery lost (its lease
        expired, its worker stopped) and that is claimed again sends its work under the same key. A
        new one after a failure that counted, and for every run an operator's retry starts."""
        return f"castad-{self.pipeline_id}-{self.reopened}-{self.counted_attempts + 1}"


def job_of(row: Any) -> Job:
    """The Job of a row of JOB_COLUMNS."""
    values = row._asdict()
    values["status"] = machine.Status(values["status"])
    values["waited_s"] = float(values["waited_s"])
    if values["previous_waited_s"] is not None:
        values["previous_waited_s"] = float(values["previous_waited_s"])
    return Job(**values)
