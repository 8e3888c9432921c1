"""Every SQL statement the relay runs on a service's outbox table.

A row the broker refused is "held" while it backs off (`retry_at` ahead) or once it is
parked; a held row holds back the later rows of its own pipeline, and nothing else.

The service's role owns the database the relay reads: it may define operators, functions and a search path of its
own there, and the database's settings apply to every session. So every session of the relay first resolves names
in PostgreSQL's own catalog only (`PINNED`, which overrides any setting of the database or role), every table is
named with its schema, and what the relay judges and publishes is a row's columns as stored, its envelope parsed
by the relay (`PENDING`).
"""

# Run first in every session of the relay: names resolve in PostgreSQL's own catalog only. A statement, not a
# startup parameter, so that a pooler in session mode passes it on as well (PgBouncer drops or refuses `options`).
PINNED = "SET search_path TO pg_catalog"

# The lease of the relay that leads (castad_relay.leadership): taken once it ran out (a new term), or renewed
# by its holder under its own term; its term, or no row if another relay holds it.
TAKE_LEASE = """
INSERT INTO public.outbox_leader AS lease (id, term, holder, expires_at, renewed_at)
VALUES (true, 1, %(holder)s, now() + make_interval(secs => %(lease_s)s), now())
ON CONFLICT (id) DO UPDATE
SET term = CASE WHEN lease.holder = EXCLUDED.holder AND lease.term = %(term)s THEN lease.term ELSE lease.term + 1 END,
    holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at, renewed_at = now()
WHERE (lease.holder = EXCLUDED.holder AND lease.term = %(term)s) OR lease.expires_at < now()
RETURNING term
"""

# A look before taking or renewing the lease (a read, so a standby's look each second writes nothing): who holds
# it, whether it ran out and for how many seconds (NULL holder: no relay ever took it), and how many relays are
# live here besides this one (castad_relay.leadership.Spread).
LOOK = """
SELECT lease.holder, lease.term, lease.expires_at < now(), extract(epoch FROM now() - lease.expires_at)::float8,
       (SELECT count(*) FROM public.outbox_relay WHERE expires_at >= now() AND holder <> %(holder)s)
FROM (SELECT) AS one LEFT JOIN public.outbox_leader AS lease ON true
"""

# This relay is live: its row among the relays of this database, ending like a lease (written every third
# of it). Rows of relays gone for an hour are cleared on the way.
HEARTBEAT = """
WITH gone AS (DELETE FROM public.outbox_relay WHERE expires_at < now() - interval '1 hour')
INSERT INTO public.outbox_relay AS relay (holder, expires_at)
VALUES (%(holder)s, now() + make_interval(secs => %(lease_s)s))
ON CONFLICT (holder) DO UPDATE SET expires_at = EXCLUDED.expires_at
"""

# A stopping relay leaves the roll at once, so the others count it out without waiting.
LEAVE = "DELETE FROM public.outbox_relay WHERE holder = %(holder)s"

# A stopping leader, or one handing the lease over to another relay, ends its lease at once.
RELEASE_LEASE = "UPDATE public.outbox_leader SET expires_at = now() WHERE holder = %(holder)s AND term = %(term)s"

# The oldest publishable rows: not published, not parked, not backing off, and with no held
# row earlier in their pipeline (partial indexes outbox_unpublished and outbox_held). Always from
# the oldest: a row that came due, was republished or committed late goes before the later rows
# of its pipeline.
# The envelope as stored: the relay takes it apart itself (`publisher.taken_apart`) and judges the very fields it
# publishes (`ownership`), never a value the database computed. `version`: the transaction that last wrote the row
# (its xmin), which names a park's notice (`relay._tell_operators`).
PENDING = """
SELECT id, event_id, pipeline_id, routing_key, created_at, publish_attempts, destination, envelope,
  o.xmin::text AS version
FROM public.outbox AS o
WHERE o.published_at IS NULL AND o.parked_at IS NULL AND (o.retry_at IS NULL OR o.retry_at <= now())
  AND NOT EXISTS (
    SELECT 1 FROM public.outbox AS held
    WHERE held.pipeline_id = o.pipeline_id AND held.id < o.id AND held.published_at IS NULL
      AND (held.parked_at IS NOT NULL OR held.retry_at IS NOT NULL)
      AND (held.parked_at IS NOT NULL OR held.retry_at > now())
  )
ORDER BY o.id
LIMIT %(limit)s
"""

# A row another leader marked already (a relay that lost its lease marks what it had confirmed) keeps its time.
MARK_PUBLISHED = "UPDATE public.outbox SET published_at = now() WHERE id = ANY(%(marked)s) AND published_at IS NULL"

# For the relay's own session: its commits do not wait for their WAL flush. A mark lost to a crash of the
# database only sends its rows again, which every consumer's inbox takes as duplicates; nothing else the
# session writes may be lost (`DURABLY`).
LAZY_COMMITS = "SET synchronous_commit TO off"
DURABLY = "SET LOCAL synchronous_commit TO on"

# One refusal more: back off, or park (once the tries are used up and the operators were told). Committed
# `DURABLY`: a park that a crash undid would tell the operators a second time. Only under the leader's term:
# a relay that lost the lease (and whose rows another one now publishes) changes none.
REFUSED = """
UPDATE public.outbox
SET publish_attempts = publish_attempts + 1,
    last_error = %(reason)s,
    retry_at = now() + make_interval(secs => %(delay_s)s),
    parked_at = CASE WHEN %(park)s THEN now() END
WHERE id = %(id)s AND published_at IS NULL AND EXISTS (SELECT 1 FROM public.outbox_leader WHERE term = %(term)s)
"""

# Rows held for a queue that must take them and does not exist yet, or for a replica that reads them: due again a
# moment later, with the reason, no try charged; like a backing-off row, each holds back only the later rows of its
# pipeline. Under the leader's term only.
WAIT = """
UPDATE public.outbox SET last_error = %(reason)s, retry_at = now() + make_interval(secs => %(delay_s)s)
WHERE id = ANY(%(ids)s) AND published_at IS NULL AND EXISTS (SELECT 1 FROM public.outbox_leader WHERE term = %(term)s)
"""

# Seconds until the earliest backing-off row is due (NULL if none backs off).
NEXT_RETRY_IN = """
SELECT extract(epoch FROM min(retry_at) - now())
FROM public.outbox
WHERE published_at IS NULL AND parked_at IS NULL AND retry_at IS NOT NULL
"""

# For the metrics, at scrape time: rows waiting to be published (not parked: those are counted apart),
# the age of the oldest of them by the database's clock, and the parked rows (outbox_unpublished and
# outbox_held: each part one indexed look).
BACKLOG = """
SELECT
  (SELECT count(*) FROM public.outbox WHERE published_at IS NULL AND parked_at IS NULL) AS backlog,
  coalesce((SELECT extract(epoch FROM now() - created_at) FROM public.outbox
            WHERE published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT 1), 0) AS oldest_s,
  (SELECT count(*) FROM public.outbox WHERE published_at IS NULL AND parked_at IS NOT NULL) AS parked
"""
