"""Tables the shared runtime reads and writes in a service's own database.

Migrations create them (castad_runtime.migration_ops, castad_runtime.stage.schema); a test checks that the
migrated schema matches these definitions.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from castad_runtime.stage import machine

metadata = sa.MetaData()

TZ = sa.DateTime(timezone=True)


def sql_strings(values: Iterable[str]) -> str:
    """Return `values` as SQL's parenthesised list of string literals, in their order: `('A', 'B')`.

    For statuses an index predicate names: PostgreSQL keeps the order the migration wrote them in, and a test
    compares the migrated index with the one these tables describe.
    """
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


def job_statuses(statuses: frozenset[machine.Status]) -> str:
    """Return the stage machine's `statuses` as SQL's list, in the order the machine declares them."""
    return sql_strings(status for status in machine.Status if status in statuses)


# Retention's predicates (castad_runtime.retention), written once for its partial indexes and its queries alike,
# so that the planner sees the index's own predicate in the query.
CLAIMABLE_JOB = f"status IN {job_statuses(machine.NEW_ATTEMPT)} OR (status = 'AWAITING' AND due_at <= submitted_at)"
PROBED_JOB = "status = 'AWAITING' AND due_at > submitted_at"
FINISHED_JOB = f"status IN {job_statuses(machine.TERMINAL)}"
UNSWEPT_JOB = "(artifacts_swept_at IS NULL OR artifacts_swept_at < finished_at)"  # files not deleted since it ended

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False, unique=True),
    sa.Column("pipeline_id", sa.Text, nullable=False),
    sa.Column("routing_key", sa.Text, nullable=False),
    sa.Column("envelope", pg.JSONB, nullable=False),
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("published_at", TZ),
    # A row the broker refused: how often, why, when to try again; parked once the tries ran out.
    sa.Column("publish_attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text),
    sa.Column("retry_at", TZ),
    sa.Column("parked_at", TZ),
    sa.Column("destination", sa.Text),  # a queue to send the row to alone; NULL: the events exchange
    sa.Index("outbox_unpublished", "id", postgresql_where=sa.text("published_at IS NULL AND parked_at IS NULL")),
    sa.Index(
        "outbox_held",
        "pipeline_id",
        "id",
        postgresql_where=sa.text("published_at IS NULL AND (parked_at IS NOT NULL OR retry_at IS NOT NULL)"),
    ),
    sa.Index("outbox_published", "published_at", postgresql_where=sa.text("published_at IS NOT NULL")),
)

# The relay that publishes this database's outbox (castad_relay.leadership): one row, the lease of its
# leader. `term` grows by one whenever another relay takes over, so a leader knows whether it still leads.
outbox_leader = sa.Table(
    "outbox_leader",
    metadata,
    sa.Column("id", sa.Boolean, primary_key=True, server_default=sa.true()),
    sa.Column("term", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("expires_at", TZ, nullable=False),
    sa.Column("renewed_at", TZ, nullable=False),
    sa.CheckConstraint("id", name="outbox_leader_one_row"),
)

# The relays that drain this database's outbox (castad_relay.leadership.Spread): one row per live relay, renewed
# with its looks, ending like a lease. How many there are tells each relay its fair share of the outboxes.
outbox_relay = sa.Table(
    "outbox_relay",
    metadata,
    sa.Column("holder", sa.Text, primary_key=True),
    sa.Column("expires_at", TZ, nullable=False),
)

# The service's replicas, each with its release and what it reads (castad_runtime.announcement): one row per
# replica, renewed while it runs, no longer live once it stops. The relays read it before they publish an event to
# the service, so that an event waits in its outbox until a replica that reads it runs.
replicas = sa.Table(
    "replicas",
    metadata,
    sa.Column("replica", sa.Text, primary_key=True),
    sa.Column("release", sa.Text, nullable=False),
    sa.Column("reads", pg.JSONB, nullable=False),  # event type -> the newest version of it the replica reads
    sa.Column("started_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("seen_at", TZ, nullable=False, server_default=sa.func.now()),
)

inbox = sa.Table(
    "inbox",
    metadata,
    sa.Column("event_id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("event_type", sa.Text, nullable=False),
    sa.Column("pipeline_id", sa.Text, nullable=False),
    sa.Column("received_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Index("inbox_received", "received_at"),
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("pipeline_id", sa.Text, nullable=False, unique=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False, server_default="0"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    # Attempts charged against max_attempts: those the machinery lost are not (see the stage runner).
    sa.Column("counted_attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("due_at", TZ, nullable=False),
    sa.Column("lease_owner", sa.Text),
    sa.Column("lease_expires_at", TZ),
    # The trigger's payload; NULL while it has not come (a CANCELED or WAITING job).
    sa.Column("input", pg.JSONB(none_as_null=True)),
    # The version of the trigger's type `input` is stored as: the oldest that carries it whole. NULL: stored by a
    # release before versions were kept, as the newest version that release knew.
    sa.Column("input_version", sa.Integer),
    sa.Column("result", pg.JSONB),
    sa.Column("last_error_code", sa.Text),
    sa.Column("last_error_message", sa.Text),
    sa.Column("traceparent", sa.Text),
    sa.Column("tracestate", sa.Text),
    # Operator requests (cancels, retries) of the pipeline applied here, in order: the last one's number.
    sa.Column("last_operation", sa.Integer, nullable=False, server_default="0"),
    # Operator retries that reopened the job: each starts a new run, whose submissions to a provider get new keys.
    sa.Column("reopened", sa.Integer, nullable=False, server_default="0"),
    # The provider's id of the work this attempt submitted to it (NULL: nothing submitted), since when,
    # and how many polls found it unfinished.
    sa.Column("handle", sa.Text),
    sa.Column("submitted_at", TZ),
    sa.Column("polls", sa.Integer, nullable=False, server_default="0"),
    # When the provider called back while a worker held the job (submitting or polling it): the poll that
    # worker schedules is due at once instead (NULL: no callback since the job was last handed to a worker).
    sa.Column("called_back_at", TZ),
    # The handle of the work the last attempt that failed with work at the provider had submitted: the next
    # attempt looks it up before submitting, and takes its result if it is there (castad_runtime.stage.remote),
    # or waits on it while it is still at work: since `previous_submitted_at` at most the give-up time.
    sa.Column("previous_handle", sa.Text),
    sa.Column("previous_submitted_at", TZ),
    # The draft a person decides on (status REVIEW, due when its review times out), and what they decided
    # (castad_runtime.stage.reviews).
    sa.Column("review", pg.JSONB),
    # Whose work it is and its weight, as its trigger told (events.Share; '' and 1: none told): the claims take
    # turns across tenants (castad_runtime.stage.fair).
    sa.Column("tenant", sa.Text, nullable=False, server_default=""),
    sa.Column("weight", sa.Integer, nullable=False, server_default="1"),
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("finished_at", TZ),
    # When retention last deleted the stage's files of this job; earlier than finished_at: it ended again since.
    sa.Column("artifacts_swept_at", TZ),
    sa.Index("jobs_due", "due_at", postgresql_where=sa.text(f"status IN {job_statuses(machine.CLAIMABLE)}")),
    sa.Index("jobs_review_due", "due_at", postgresql_where=sa.text("status = 'REVIEW'")),
    sa.Index("jobs_fair", "tenant", "due_at", postgresql_where=sa.text(f"status IN {job_statuses(machine.CLAIMABLE)}")),
    # While a prober polls the jobs waiting at a provider (castad_runtime.stage.probes): what a claim takes, and
    # what the prober asks about (castad_runtime.stage.repository: claiming.READY, polls.CLAIM_PROBES).
    sa.Index("jobs_claimable", "due_at", postgresql_where=sa.text(CLAIMABLE_JOB)),
    sa.Index("jobs_probes", "due_at", postgresql_where=sa.text(PROBED_JOB)),
    sa.Index("jobs_leased", "lease_expires_at", postgresql_where=sa.text("status = 'RUNNING'")),
    sa.Index("jobs_in_flight", "status", postgresql_where=sa.text("status IN ('RUNNING', 'AWAITING')")),
    sa.Index("jobs_finished", "finished_at", postgresql_where=sa.text(FINISHED_JOB)),
    sa.Index("jobs_unswept", "finished_at", postgresql_where=sa.text(f"{FINISHED_JOB} AND {UNSWEPT_JOB}")),
)

# A provider's limits, shared by every worker of the service: a token bucket whose rate halves when the
# provider says "too many" and climbs back step by step (AIMD), and a cap on jobs at the provider at once.
quotas = sa.Table(
    "quotas",
    metadata,
    sa.Column("provider", sa.Text, primary_key=True),
    sa.Column("max_in_flight", sa.Integer),  # NULL: no cap
    sa.Column("max_rate_per_s", sa.Float, nullable=False),
    sa.Column("min_rate_per_s", sa.Float, nullable=False),
    sa.Column("burst", sa.Float, nullable=False),
    sa.Column("rate_per_s", sa.Float, nullable=False),  # now, between the two
    # The one bucket of the services before migration 0012, which they go on using during an upgrade; this version
    # keeps its tokens in quota_shards.
    sa.Column("tokens", sa.Float, nullable=False),
    sa.Column("refilled_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("blocked_until", TZ),  # the provider's Retry-After
    sa.Column("throttled", sa.Integer, nullable=False, server_default="0"),  # times it said "too many"
    sa.Column("shards", sa.Integer, nullable=False, server_default="1"),  # rows of quota_shards its bucket is in
)

# A provider's token bucket split into rows, each with its share of the burst and of the rate, so that concurrent
# claims take tokens from different rows (castad_runtime.stage.quota).
quota_shards = sa.Table(
    "quota_shards",
    metadata,
    sa.Column("provider", sa.Text, primary_key=True),
    sa.Column("shard", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("tokens", sa.Float, nullable=False),
    sa.Column("refilled_at", TZ, nullable=False, server_default=sa.func.now()),
)

# The jobs RUNNING or AWAITING, counted by triggers on jobs (castad_runtime.stage.schema.add_sharded_quota_v12)
# over this many rows: their sum is the count. `cap`: the row's share of the provider's cap on jobs in flight.
IN_FLIGHT_SHARDS = 64
in_flight_counts = sa.Table(
    "in_flight_counts",
    metadata,
    sa.Column("shard", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("jobs", sa.BigInteger, nullable=False),
    sa.Column("cap", sa.BigInteger),  # NULL: no cap
)

attempts = sa.Table(
    "attempts",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", pg.UUID(as_uuid=True), sa.ForeignKey("jobs.id"), nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("worker", sa.Text, nullable=False),
    sa.Column("started_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("finished_at", TZ),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("error_code", sa.Text),
    sa.Column("error_message", sa.Text),
    # The attempt's work sent to a network provider (recorded just before it left, under a lease known to be
    # held), and the key it was tagged with: the same for every claim of one counted attempt.
    sa.Column("submitted_at", TZ),
    sa.Column("submission_key", sa.Text),
    sa.Column("notes", sa.Text),  # the provider's advisory warnings on the submitted work, one per line
    # Requests for work that left for the provider (each recorded as it left) that no event of the attempt has told
    # yet: the next one tells them (events.PROVIDER_CALLS), for the gateway's metering.
    sa.Column("untold_calls", sa.Integer, nullable=False, server_default="0"),
    sa.UniqueConstraint("job_id", "number", name="attempts_job_number"),
)

# Each tenant's place in the stages' fair turns (castad_runtime.stage.fair): the virtual time its last claim started
# at and the one its next may start at, at the earliest.
shares = sa.Table(
    "shares",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("start", sa.Float, nullable=False),
    sa.Column("finish", sa.Float, nullable=False),
)

# Faults injected into a stage's provider calls while it runs, for tests and demos (castad_runtime.stage.faults):
# read only by a service whose CASTAD_<STAGE>_FAULT_SWITCH is on. At most one row; none: the configured faults.
injected_faults = sa.Table(
    "injected_faults",
    metadata,
    sa.Column("one", sa.Boolean, primary_key=True, server_default=sa.true()),
    sa.Column("failure_rate", sa.Float, nullable=False, server_default="0"),
    sa.Column("retryable", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("latency_s", sa.Float, nullable=False, server_default="0"),
    sa.Column("hang_rate", sa.Float, nullable=False, server_default="0"),
    sa.Column("permanent_rate", sa.Float, nullable=False, server_default="0"),
    sa.Column("handler_rate", sa.Float, nullable=False, server_default="0"),
    sa.Column("set_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.CheckConstraint("one", name="injected_faults_one_row"),
)
