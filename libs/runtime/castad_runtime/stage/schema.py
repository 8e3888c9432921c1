"""Schema changes of a stage service's own tables, shared by the stage services' Alembic migrations.

Each function is one frozen revision of a set of tables: once a migration calls it,
it never changes. A later schema change gets a new function and a new migration.

Here the jobs and their attempts, the providers' quotas, the tenants' shares (castad_runtime.stage.fair) and the
injected faults; the tables every service has (outbox, inbox, replicas) change through castad_runtime.migration_ops.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

TZ = sa.DateTime(timezone=True)


def create_stage_tables_v1() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("pipeline_id", sa.Text, nullable=False, unique=True),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("due_at", TZ, nullable=False),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_expires_at", TZ),
        sa.Column("input", pg.JSONB, nullable=False),
        sa.Column("result", pg.JSONB),
        sa.Column("last_error_code", sa.Text),
        sa.Column("last_error_message", sa.Text),
        sa.Column("traceparent", sa.Text),
        sa.Column("tracestate", sa.Text),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", TZ),
    )
    op.create_index("jobs_due", "jobs", ["due_at"], postgresql_where=sa.text("status IN ('PENDING', 'RETRY_WAIT')"))
    op.create_index("jobs_leased", "jobs", ["lease_expires_at"], postgresql_where=sa.text("status = 'RUNNING'"))
    op.create_table(
        "attempts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("job_id", pg.UUID(as_uuid=True), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("started_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", TZ),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("error_code", sa.Text),
        sa.Column("error_message", sa.Text),
        sa.UniqueConstraint("job_id", "number", name="attempts_job_number"),
    )


def add_counted_attempts_v2() -> None:
    """Attempts charged against max_attempts, apart from attempts started: the machinery's are not."""
    op.add_column("jobs", sa.Column("counted_attempts", sa.Integer, nullable=False, server_default="0"))
    op.execute("UPDATE jobs SET counted_attempts = attempts - CASE WHEN status = 'RUNNING' THEN 1 ELSE 0 END")


def drop_counted_attempts_v2() -> None:
    op.drop_column("jobs", "counted_attempts")


def add_operator_requests_v3() -> None:
    """Jobs know their pipeline's operator requests: canceled before their trigger (no input), in order."""
    op.alter_column("jobs", "input", nullable=True)
    op.add_column("jobs", sa.Column("last_operation", sa.Integer, nullable=False, server_default="0"))


def add_remote_jobs_v4() -> None:
    """Work submitted to a provider waits as AWAITING with its handle (no worker held); provider quotas."""
    op.add_column("jobs", sa.Column("handle", sa.Text))
    op.add_column("jobs", sa.Column("submitted_at", TZ))
    op.add_column("jobs", sa.Column("polls", sa.Integer, nullable=False, server_default="0"))
    op.drop_index("jobs_due", "jobs")
    op.create_index(
        "jobs_due", "jobs", ["due_at"], postgresql_where=sa.text("status IN ('PENDING', 'RETRY_WAIT', 'AWAITING')")
    )
    op.create_index("jobs_in_flight", "jobs", ["status"], postgresql_where=sa.text("status IN ('RUNNING', 'AWAITING')"))
    op.create_table(
        "quotas",
        sa.Column("provider", sa.Text, primary_key=True),
        sa.Column("max_in_flight", sa.Integer),
        sa.Column("max_rate_per_s", sa.Float, nullable=False),
        sa.Column("min_rate_per_s", sa.Float, nullable=False),
        sa.Column("burst", sa.Float, nullable=False),
        sa.Column("rate_per_s", sa.Float, nullable=False),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("refilled_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("blocked_until", TZ),
        sa.Column("throttled", sa.Integer, nullable=False, server_default="0"),
    )


def drop_remote_jobs_v4() -> None:
    op.drop_table("quotas")
    op.drop_index("jobs_in_flight", "jobs")
    op.drop_index("jobs_due", "jobs")
    op.create_index("jobs_due", "jobs", ["due_at"], postgresql_where=sa.text("status IN ('PENDING', 'RETRY_WAIT')"))
    # Work waiting on a provider is submitted again by the older code: it knows no handles.
    op.execute("UPDATE jobs SET status = 'RETRY_WAIT' WHERE status = 'AWAITING'")
    for column in ("polls", "submitted_at", "handle"):
        op.drop_column("jobs", column)


def drop_operator_requests_v3() -> None:
    op.drop_column("jobs", "last_operation")
    op.execute("DELETE FROM jobs WHERE input IS NULL")  # jobs canceled before they had anything to run
    op.alter_column("jobs", "input", nullable=False)


def add_job_retention_v5() -> None:
    """A stage's finished jobs by when they ended, and when retention deleted their files."""
    finished = "status IN ('SUCCEEDED', 'FAILED', 'CANCELED')"
    op.add_column("jobs", sa.Column("artifacts_swept_at", TZ))
    op.create_index("jobs_finished", "jobs", ["finished_at"], postgresql_where=sa.text(finished))
    op.create_index(
        "jobs_unswept",
        "jobs",
        ["finished_at"],
        postgresql_where=sa.text(f"{finished} AND (artifacts_swept_at IS NULL OR artifacts_swept_at < finished_at)"),
    )


def drop_job_retention_v5() -> None:
    op.drop_index("jobs_unswept", "jobs")
    op.drop_index("jobs_finished", "jobs")
    op.drop_column("jobs", "artifacts_swept_at")


def add_probe_indexes_v14() -> None:
    """What a claim takes and what the prober polls, while a prober polls the jobs waiting at a provider."""
    claimable = "status IN ('PENDING', 'RETRY_WAIT') OR (status = 'AWAITING' AND due_at <= submitted_at)"
    op.create_index("jobs_claimable", "jobs", ["due_at"], postgresql_where=sa.text(claimable))
    op.create_index(
        "jobs_probes", "jobs", ["due_at"], postgresql_where=sa.text("status = 'AWAITING' AND due_at > submitted_at")
    )


def drop_probe_indexes_v14() -> None:
    op.drop_index("jobs_probes", "jobs")
    op.drop_index("jobs_claimable", "jobs")


def add_called_back_v15() -> None:
    """When the provider called back while a worker held the job, so that the poll it schedules is due at once.

    Expand only: a service of the previous version neither sets nor reads it.
    """
    op.add_column("jobs", sa.Column("called_back_at", TZ))


def drop_called_back_v15() -> None:
    op.drop_column("jobs", "called_back_at")


def add_injected_faults_v16() -> None:
    """The faults a stage injects while it runs, when its fault switch is on (tests and demos).

    Expand only: a service of the previous version never reads it.
    """
    op.create_table(
        "injected_faults",
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


def drop_injected_faults_v16() -> None:
    op.drop_table("injected_faults")


def add_input_version_v17() -> None:
    """The version of its trigger a job's input is stored as (`jobs.input_version`).

    Expand only: a replica of the previous release neither writes nor reads it (it reads the input as its newest
    version, as before); NULL, in rows it writes, is read so by this release too.
    """
    op.add_column("jobs", sa.Column("input_version", sa.Integer))


def drop_input_version_v17() -> None:
    op.drop_column("jobs", "input_version")


def add_previous_submitted_at_v19() -> None:
    """When the work an earlier attempt left at the provider was submitted (`jobs.previous_submitted_at`).

    A new attempt waits on that work while it is still at work, up to the give-up time counted from then. Expand
    only: a replica of the previous release neither writes nor reads it. Where it ends an attempt, the column keeps
    an earlier work's time (or NULL, counted from the next claim): the next attempt then judges that work by an
    earlier submit, and may submit anew as the previous release did.
    """
    op.add_column("jobs", sa.Column("previous_submitted_at", TZ))


def drop_previous_submitted_at_v19() -> None:
    op.drop_column("jobs", "previous_submitted_at")


def add_reviews_v20() -> None:
    """A draft waiting for a person's decision (status REVIEW) is kept in its job's row, due when it times out."""
    op.add_column("jobs", sa.Column("review", pg.JSONB))
    op.create_index("jobs_review_due", "jobs", ["due_at"], postgresql_where=sa.text("status = 'REVIEW'"))


def drop_reviews_v20() -> None:
    # A release before reviews drafts again, and its draft goes on without one.
    op.execute("UPDATE jobs SET status = 'RETRY_WAIT', due_at = now() WHERE status = 'REVIEW'")
    op.drop_index("jobs_review_due", "jobs")
    op.drop_column("jobs", "review")


def add_fair_share_v21() -> None:
    """Whose work each job is (its claims take turns across tenants), and the requests for work no event told yet."""
    op.add_column("jobs", sa.Column("tenant", sa.Text, nullable=False, server_default=""))
    op.add_column("jobs", sa.Column("weight", sa.Integer, nullable=False, server_default="1"))
    op.create_index(
        "jobs_fair",
        "jobs",
        ["tenant", "due_at"],
        postgresql_where=sa.text("status IN ('PENDING', 'RETRY_WAIT', 'AWAITING')"),
    )
    op.create_table(
        "shares",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("start", sa.Float, nullable=False),
        sa.Column("finish", sa.Float, nullable=False),
    )
    op.add_column("attempts", sa.Column("untold_calls", sa.Integer, nullable=False, server_default="0"))


def drop_fair_share_v21() -> None:
    op.drop_column("attempts", "untold_calls")
    op.drop_table("shares")
    op.drop_index("jobs_fair", "jobs")
    op.drop_column("jobs", "weight")
    op.drop_column("jobs", "tenant")


def add_submissions_v8() -> None:
    """What a stage sent to a provider.

    Each attempt's submission, recorded (with its key) just before it left; and the operator's retries that
    reopened a job, so that a new run's submissions have new keys.
    """
    op.add_column("attempts", sa.Column("submitted_at", TZ))
    op.add_column("attempts", sa.Column("submission_key", sa.Text))
    op.add_column("jobs", sa.Column("reopened", sa.Integer, nullable=False, server_default="0"))


def drop_submissions_v8() -> None:
    op.drop_column("jobs", "reopened")
    op.drop_column("attempts", "submission_key")
    op.drop_column("attempts", "submitted_at")


def add_previous_handle_v9() -> None:
    """The provider's handle of the work an attempt that failed had submitted.

    The next attempt looks it up (castad_runtime.stage.remote) and takes its result if it is there, rather than
    paying for new work.
    """
    op.add_column("jobs", sa.Column("previous_handle", sa.Text))


def drop_previous_handle_v9() -> None:
    op.drop_column("jobs", "previous_handle")


def add_attempt_notes_v10() -> None:
    """Keep the provider's advisory warnings on an attempt's submitted work.

    Such as a render template's unmatched elements; they are kept on the attempt for an operator.
    """
    op.add_column("attempts", sa.Column("notes", sa.Text))


def drop_attempt_notes_v10() -> None:
    op.drop_column("attempts", "notes")


IN_FLIGHT_SHARDS_V12 = 64
IN_FLIGHT_FUNCTION = "castad_jobs_in_flight"
IN_FLIGHT = "('RUNNING', 'AWAITING')"


def add_sharded_quota_v12() -> None:
    """Split a provider's token bucket into rows, and count the jobs in flight by triggers over rows of their own.

    No claim locks a row that every other claim needs, none counts the jobs (castad_runtime.stage.quota).
    The count starts from the jobs in flight now: the triggers are created in this transaction, which holds
    jobs against every write from then until it commits, so that no change is counted twice or missed."""
    op.add_column("quotas", sa.Column("shards", sa.Integer, nullable=False, server_default="1"))
    op.create_table(
        "quota_shards",
        sa.Column("provider", sa.Text, primary_key=True),
        sa.Column("shard", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("refilled_at", TZ, nullable=False, server_default=sa.func.now()),
    )
    op.execute(
        "INSERT INTO quota_shards (provider, shard, tokens, refilled_at) SELECT provider, 0, tokens, now() FROM quotas"
    )
    op.create_table(
        "in_flight_counts",
        sa.Column("shard", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("jobs", sa.BigInteger, nullable=False),
        sa.Column("cap", sa.BigInteger),
    )
    # A row below its cap (to take a job away: a row above its cap first, then any), preferring the connection's
    # own, that no other transaction holds: a trigger waits for a row only when every row is held.
    op.execute(
        f"""CREATE FUNCTION {IN_FLIGHT_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    delta integer := 0;
    target integer;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE in_flight_counts SET jobs = 0;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.status IN {IN_FLIGHT} THEN delta := delta + 1; END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.status IN {IN_FLIGHT} THEN delta := delta - 1; END IF;
    IF delta = 0 THEN RETURN NULL; END IF;
    SELECT shard INTO target FROM in_flight_counts WHERE delta < 0 OR cap IS NULL OR jobs < cap
        ORDER BY coalesce(delta < 0 AND jobs > cap, false) DESC,
            shard = mod(pg_backend_pid(), {IN_FLIGHT_SHARDS_V12}) DESC
        LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT shard INTO target FROM in_flight_counts
            ORDER BY shard = mod(pg_backend_pid(), {IN_FLIGHT_SHARDS_V12}) DESC LIMIT 1 FOR UPDATE SKIP LOCKED;
    END IF;
    UPDATE in_flight_counts SET jobs = jobs + delta
        WHERE shard = coalesce(target, mod(pg_backend_pid(), {IN_FLIGHT_SHARDS_V12}));
    RETURN NULL;
END $$"""
    )
    op.execute(
        "CREATE TRIGGER jobs_in_flight_insert AFTER INSERT ON jobs FOR EACH ROW"
        f" WHEN (NEW.status IN {IN_FLIGHT}) EXECUTE FUNCTION {IN_FLIGHT_FUNCTION}()"
    )
    op.execute(
        "CREATE TRIGGER jobs_in_flight_update AFTER UPDATE OF status ON jobs FOR EACH ROW"
        f" WHEN ((OLD.status IN {IN_FLIGHT}) IS DISTINCT FROM (NEW.status IN {IN_FLIGHT}))"
        f" EXECUTE FUNCTION {IN_FLIGHT_FUNCTION}()"
    )
    op.execute(
        "CREATE TRIGGER jobs_in_flight_delete AFTER DELETE ON jobs FOR EACH ROW"
        f" WHEN (OLD.status IN {IN_FLIGHT}) EXECUTE FUNCTION {IN_FLIGHT_FUNCTION}()"
    )
    op.execute(
        f"CREATE TRIGGER jobs_in_flight_truncate AFTER TRUNCATE ON jobs FOR EACH STATEMENT"
        f" EXECUTE FUNCTION {IN_FLIGHT_FUNCTION}()"
    )
    op.execute(
        "INSERT INTO in_flight_counts (shard, jobs, cap)"
        f" SELECT shard, CASE WHEN shard = 0 THEN (SELECT count(*) FROM jobs WHERE status IN {IN_FLIGHT}) ELSE 0 END,"
        " NULL"
        f" FROM generate_series(0, {IN_FLIGHT_SHARDS_V12 - 1}) AS shard"
    )


def drop_sharded_quota_v12() -> None:
    for trigger in ("truncate", "delete", "update", "insert"):
        op.execute(f"DROP TRIGGER jobs_in_flight_{trigger} ON jobs")
    op.execute(f"DROP FUNCTION {IN_FLIGHT_FUNCTION}()")
    op.drop_table("in_flight_counts")
    op.drop_table("quota_shards")
    op.drop_column("quotas", "shards")
