"""Each service's migrated schema is exactly what its SQLAlchemy tables describe.

Two views: Alembic's autogenerate comparison (columns, types, nullability, defaults,
keys, indexes) and PostgreSQL's own catalog of a database migrated by Alembic next to
one created from the metadata by `create_all`, which also sees what Alembic does not
compare (partial-index predicates, identity columns, constraint definitions).
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from castad_api import tables as api_tables
from castad_contracts import topology
from castad_local import stack
from castad_runtime import migrations, tables

from tests.support.servers import database_url

pytestmark = pytest.mark.integration

STAGE_TABLES = (
    tables.outbox,
    tables.outbox_leader,
    tables.outbox_relay,
    tables.replicas,
    tables.inbox,
    tables.jobs,
    tables.attempts,
    tables.quotas,
    tables.quota_shards,
    tables.in_flight_counts,
    tables.injected_faults,
    tables.shares,
)
SERVICE_TABLES: dict[str, tuple[sa.Table, ...]] = {
    "api": (
        tables.outbox,
        tables.outbox_leader,
        tables.outbox_relay,
        tables.replicas,
        tables.inbox,
        api_tables.pipelines,
        api_tables.stages,
        api_tables.attempts,
        api_tables.timeline,
        api_tables.dead_letters,
        api_tables.dead_letter_actions,
        api_tables.webhook_deliveries,
        api_tables.webhook_attempts,
        api_tables.webhook_secrets,
        api_tables.gateway_keys,
        api_tables.api_keys,
        api_tables.key_windows,
        api_tables.images,
        api_tables.upload_buckets,
        api_tables.brand_kits,
        api_tables.pipeline_reviews,
        api_tables.tenants,
        api_tables.budgets,
        api_tables.usage,
    ),
    **dict.fromkeys(topology.STAGES, STAGE_TABLES),
}
MIGRATIONS = {database.service: database.migrations_dir for database in stack.DATABASES}


def service_metadata(service: str) -> sa.MetaData:
    """The tables of one service (the runtime's and the gateway's share one MetaData object)."""
    metadata = sa.MetaData()
    for table in SERVICE_TABLES[service]:
        table.to_metadata(metadata)
    if service == "api":  # its extensions, as its migrations create them (to_metadata copies no listener)
        sa.event.listen(metadata, "before_create", api_tables.EXTENSIONS)
    return metadata


def differences(engine: sa.Engine, metadata: sa.MetaData) -> list[Any]:
    def include(name: str | None, kind: str, _: object) -> bool:
        return not (kind == "table" and name == "alembic_version")

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True, "include_name": include}
        )
        return compare_metadata(context, metadata)


def catalog(engine: sa.Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Columns, indexes and constraints of every table but alembic_version, as PostgreSQL states them."""
    queries = {
        "columns": """
            SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity, identity_generation
            FROM information_schema.columns WHERE table_schema = 'public' AND table_name <> 'alembic_version'
            ORDER BY 1, 2""",
        "indexes": """
            SELECT tablename, indexname, indexdef FROM pg_indexes
            WHERE schemaname = 'public' AND tablename <> 'alembic_version' ORDER BY 1, 2""",
        "constraints": """
            SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
            WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text <> 'alembic_version'
            ORDER BY 1, 2""",
    }
    with engine.connect() as conn:
        return {name: [tuple(row) for row in conn.execute(sa.text(query))] for name, query in queries.items()}


@pytest.fixture
def scratch_engine() -> Iterator[sa.Engine]:
    """An empty database of its own."""
    url = database_url(f"castad_scratch_{uuid.uuid4().hex[:10]}")
    migrations.ensure_database(url)
    engine = sa.create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()
        migrations.drop_database(url)


def test_each_migrated_schema_matches_its_table_metadata(engines, scratch_engine):
    """Each service's migrated schema is exactly the one its table metadata describes.

    For every service, Alembic finds nothing to change, and PostgreSQL describes the migrated database exactly as
    one created from the metadata.
    """
    alembic_view, catalog_view = {}, {}
    for service in SERVICE_TABLES:
        metadata = service_metadata(service)
        alembic_view[service] = differences(engines[service], metadata)
        metadata.create_all(scratch_engine)
        try:
            catalog_view[service] = (catalog(engines[service]), catalog(scratch_engine))
        finally:
            metadata.drop_all(scratch_engine)

    assert alembic_view == {service: [] for service in SERVICE_TABLES}
    for service, (migrated, declared) in catalog_view.items():
        assert migrated == declared, service


def test_the_comparison_notices_a_schema_drift(engines):
    """Guard for the test above: a column the migrations do not create is reported."""
    metadata = service_metadata("lyric")
    metadata.tables["jobs"].append_column(sa.Column("priority", sa.Integer))

    [(change, _, table, column)] = differences(engines["lyric"], metadata)
    assert (change, table, column.name) == ("add_column", "jobs", "priority")


def test_migrations_go_down_to_nothing_and_up_again_to_the_same_schema(installation, engines):
    """Each service's migrations go down to nothing and up again to the same schema.

    For every service, downgrade base drops every table the migrations created and upgrade head recreates the same
    schema.
    """
    for service, engine in engines.items():
        before = catalog(engine)
        migrations.downgrade(installation.database_urls[service], MIGRATIONS[service], "base")
        assert catalog(engine) == {"columns": [], "indexes": [], "constraints": []}, service

        migrations.upgrade(installation.database_urls[service], MIGRATIONS[service])
        assert catalog(engine) == before, service


def revisions(service: str) -> list[str]:
    """The service's revisions, oldest first."""
    return [script.revision for script in reversed(list(ScriptDirectory(str(MIGRATIONS[service])).walk_revisions()))]


# Contractions made before this check saw triggers and functions, each in the release it shipped in, whose replicas
# of the release before relied on what it dropped; none may be added: contract in a release of its own, once no
# supported release uses what goes (CHANGELOG.md says which).
_WAKE_AFTER_COMMIT = (
    "the outbox's NOTIFY trigger dropped for a wake-up after the commit: rows of a replica of the release before "
    "wake no relay and wait for its fallback poll (seconds)"
)
CONTRACTED_BEFORE_THE_CHECK: dict[tuple[str, str], str] = {
    ("api", "0014"): _WAKE_AFTER_COMMIT + ", and the timeline's for the event streams' sweep",
    ("lyric", "0011"): _WAKE_AFTER_COMMIT,
    ("song", "0011"): _WAKE_AFTER_COMMIT,
    ("video", "0011"): _WAKE_AFTER_COMMIT,
}


def test_every_migration_only_expands_so_the_version_still_running_keeps_working(scratch_engine):
    """Every migration only expands the schema, so the version still running keeps working.

    Expand/contract: during a rolling upgrade the old pods run against the new schema, so a migration may add
    tables, nullable (or defaulted) columns, indexes, triggers and functions, and relax a NOT NULL; it may not drop
    or rename a table, a column, a trigger or a function, change a type or what a trigger fires on, or tighten a
    NULL.
    """
    url = scratch_engine.url.render_as_string(hide_password=False)
    for service in MIGRATIONS:
        previous: dict[str, dict[str, tuple[Any, ...]]] = {}
        previous_code: set[tuple[str, ...]] = set()
        for revision in revisions(service):
            migrations.upgrade(url, MIGRATIONS[service], revision)
            code = routines(scratch_engine)
            gone = previous_code - code
            if (service, revision) not in CONTRACTED_BEFORE_THE_CHECK:
                assert not gone, f"{service} {revision} drops, renames or changes {sorted(gone)}"
            previous_code = code
            current = columns(scratch_engine)
            for table, before in previous.items():
                after = current.get(table)
                assert after is not None, f"{service} {revision} drops table {table}"
                for name, (data_type, nullable, _) in before.items():
                    assert name in after, f"{service} {revision} drops or renames {table}.{name}"
                    assert after[name][0] == data_type, f"{service} {revision} changes the type of {table}.{name}"
                    assert after[name][1] or not nullable, f"{service} {revision} makes {table}.{name} NOT NULL"
                for name in after.keys() - before.keys():
                    _, nullable, default = after[name]
                    assert nullable or default is not None, (
                        f"{service} {revision} adds {table}.{name} NOT NULL without a default"
                    )
            previous = current
        migrations.downgrade(url, MIGRATIONS[service], "base")


def columns(engine: sa.Engine) -> dict[str, dict[str, tuple[Any, ...]]]:
    """Table -> column -> (type, nullable, default), alembic_version aside."""
    result: dict[str, dict[str, tuple[Any, ...]]] = {}
    for table, column, data_type, nullable, default in catalog_columns(engine):
        result.setdefault(table, {})[column] = (data_type, nullable == "YES", default)
    return result


def routines(engine: sa.Engine) -> set[tuple[str, ...]]:
    """The triggers (table, name, when and on what it fires, its function) and the functions (name, arguments,
    result, body) of the schema: what a release's code may rely on without naming it in a query."""
    triggers = """
        SELECT 'trigger', tgrelid::regclass::text, tgname,
               regexp_replace(pg_get_triggerdef(oid), ' EXECUTE FUNCTION .*$', ''), tgfoid::regproc::text
        FROM pg_trigger WHERE NOT tgisinternal AND tgrelid::regclass::text <> 'alembic_version'"""
    functions = """
        SELECT 'function', proname, pg_get_function_identity_arguments(oid), pg_get_function_result(oid), md5(prosrc)
        FROM pg_proc WHERE pronamespace = 'public'::regnamespace"""
    with engine.connect() as conn:
        return {tuple(row) for query in (triggers, functions) for row in conn.execute(sa.text(query))}


def catalog_columns(engine: sa.Engine) -> list[tuple[Any, ...]]:
    return [row[:5] for row in catalog(engine)["columns"]]


def test_two_migrators_at_once_take_turns_and_both_succeed(scratch_engine):
    """A hook Job run twice, or beside an old one still going: the second waits, then finds nothing to do."""
    url = scratch_engine.url.render_as_string(hide_password=False)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(migrations.upgrade, url, MIGRATIONS["lyric"]) for _ in range(2)]
        for run in runs:
            run.result(timeout=120)
    with scratch_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == revisions("lyric")[-1]
