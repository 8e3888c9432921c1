"""The operator's numbers over a window: pipelines, stages, stuck attempts, reviews, dead letters, throughput."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field

from castad_contracts import events


class Percentiles(BaseModel):
    count: int = Field(description="how many durations these are of")
    p50: float
    p95: float
    p99: float


class ErrorCount(BaseModel):
    code: str
    count: int = Field(description="attempts of the stage that ended with this error code in the window")
    rate: float = Field(description="their share of the attempts of the stage that ended in the window")


class StageStats(BaseModel):
    stage: events.Stage
    pending: int = Field(description="in-flight pipelines waiting for this stage (it has not started)")
    running: int = Field(description="in-flight pipelines whose attempt of this stage runs")
    retry_waiting: int = Field(description="in-flight pipelines waiting for this stage's next attempt")
    stuck: int = Field(description="of `running`: attempts started longer ago than CASTAD_API_STUCK_AFTER_S")
    succeeded: int = Field(description="runs of this stage that succeeded in the window")
    failed: int = Field(description="runs of this stage that failed in the window")
    canceled: int = Field(description="runs of this stage canceled in the window")
    failure_rate: float | None = Field(description="failed / (succeeded + failed); null when neither")
    duration_s: Percentiles | None = Field(
        description="of the runs that succeeded in the window, from their first attempt's start to the end"
    )
    attempts: int = Field(description="attempts that ended in the window")
    attempt_outcomes: dict[str, int] = Field(description="those attempts by outcome")
    attempt_duration_s: Percentiles | None = Field(description="of those attempts whose start is known")
    errors: list[ErrorCount] = Field(description="those attempts by error code, the most frequent first")


class PipelineCounts(BaseModel):
    in_flight: int = Field(description="pipelines that have not ended")
    in_flight_by_status: dict[str, int] = Field(description="PENDING, RUNNING, AWAITING_REVIEW and CANCELING")
    created: int = Field(description="pipelines created in the window")
    finished: dict[str, int] = Field(description="pipelines that ended in the window: SUCCEEDED, FAILED, CANCELED")


class ThroughputBucket(BaseModel):
    start: dt.datetime
    created: int
    succeeded: int
    failed: int
    canceled: int


class Throughput(BaseModel):
    per_minute: dict[str, float] = Field(
        description="created, succeeded, failed and canceled pipelines per minute, averaged over the window"
    )
    bucket_s: int = Field(description="the length of each bucket")
    buckets: list[ThroughputBucket] = Field(description="every bucket of the window, oldest first")


class StuckAttempt(BaseModel):
    pipeline_id: str
    stage: events.Stage
    attempt: int
    worker: str | None
    started_at: dt.datetime
    running_s: float


class WaitingReview(BaseModel):
    pipeline_id: str
    drafted_at: dt.datetime
    waiting_s: float
    review_until: dt.datetime


class ReviewCounts(BaseModel):
    waiting: int = Field(description="drafts that wait for a person's decision now")
    oldest: list[WaitingReview] = Field(description="the drafts that waited longest, oldest first (up to 20)")


class DeadLetterCounts(BaseModel):
    open: dict[str, int] = Field(description="dead letters still `dead` by kind (message, parked, unrecordable)")
    received: dict[str, dict[str, int]] = Field(
        description="dead letters received in the window, by kind then by status (dead, replayed, discarded)"
    )


class Stats(BaseModel):
    """The gateway's numbers over a window, from its own projection of every event."""

    at: dt.datetime = Field(description="when they were read")
    window_s: int
    since: dt.datetime
    stuck_after_s: float = Field(
        description="a stage RUNNING whose attempt started longer ago is counted as stuck: the gateway does not see"
        " leases, so this is the longest an attempt may run plus its lease (CASTAD_API_STUCK_AFTER_S)"
    )
    pipelines: PipelineCounts
    stages: list[StageStats]
    stuck: list[StuckAttempt] = Field(description="the longest-running stuck attempts, oldest first (up to 20)")
    reviews: ReviewCounts = Field(
        default_factory=lambda: ReviewCounts(waiting=0, oldest=[]),
        description="drafts waiting for a person's decision (AWAITING_REVIEW), with how long they waited",
    )
    dead_letters: DeadLetterCounts
    throughput: Throughput
