"""Fair turns across tenants: what a claim takes when several tenants' jobs wait for the stage.

Jobs wait for whatever limits a stage: its workers, its provider's quota (a token for each call), its cap on jobs at
the provider. Taken oldest first, one tenant's backlog of hundreds would hold every other tenant's work back until
it is through. So a claim takes turns across tenants instead (start-time fair queueing, with the claims as the
turns):

- Each tenant whose jobs are due has a place in a virtual time: `finish`, its `shares` row's, where its next claim
  may start at the earliest. The claim takes the due tenant whose next claim starts first: at its `finish`, or at
  the clock (the latest start any claim took) if its `finish` is behind it; ties go to the tenant with the oldest
  due job. Within the tenant, its oldest due job, as before.
- The claim moves the tenant's start there and its `finish` on by `1 / weight` (its jobs' `events.Share.weight`).
  So two waiting tenants alternate; one of weight 3 gets three turns for the other's one.
- A tenant that was idle starts at the clock: its idle time is not saved up as turns to take from the others later.
  A new tenant's first job waits for at most one turn of each other waiting tenant.

What the claim keeps: it is the same compare-and-set under a lease (`repository.claim_next`), on the job that
`FOR UPDATE SKIP LOCKED` gives it among the chosen tenant's due jobs, and the quota's token is spent as before. Two
claims at once may choose the same tenant; each then takes another of its jobs, and its `shares` row (updated by
both, the second after the first commits) moves on by both turns. If every due job of the chosen tenant is locked by
other claims at that instant, the claim finds none this time, and the next one (or the next poll) takes the next.

A job whose trigger told no share (written by a release before) belongs to tenant '' of weight 1: it takes its
turns as one more tenant. A `shares` row is a tenant's, kept for good (a few bytes each).
"""

from __future__ import annotations

# The due tenants are found by a loose scan of the index jobs_fair (tenant, due_at): one index probe a tenant
# with claimable jobs, not one a job. `{claimable}` names the statuses a claim may take; `{claim}` is the claim's
# UPDATE (repository._UPDATE), given the chosen job's id.
TURN = """
WITH RECURSIVE waiting AS (
    (SELECT tenant FROM jobs WHERE {claimable} AND due_at <= now() AND coalesce(input_version, 0) <= %(reads)s
     ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT tenant FROM jobs WHERE {claimable} AND due_at <= now() AND coalesce(input_version, 0) <= %(reads)s
                AND jobs.tenant > waiting.tenant ORDER BY tenant LIMIT 1)
    FROM waiting WHERE waiting.tenant IS NOT NULL
), clock AS (
    SELECT coalesce(max(start), 0) AS now FROM shares
), turn AS MATERIALIZED (
    SELECT waiting.tenant, greatest(coalesce(shares.finish, 0), clock.now) AS start, oldest.weight
    FROM waiting CROSS JOIN clock LEFT JOIN shares ON shares.tenant = waiting.tenant
    CROSS JOIN LATERAL (
        SELECT due_at, weight FROM jobs
        WHERE jobs.tenant = waiting.tenant AND {claimable} AND due_at <= now()
            AND coalesce(input_version, 0) <= %(reads)s
        ORDER BY due_at LIMIT 1
    ) AS oldest
    WHERE waiting.tenant IS NOT NULL
    ORDER BY 2, oldest.due_at LIMIT 1
), chosen AS MATERIALIZED (
    SELECT jobs.id FROM jobs JOIN turn ON jobs.tenant = turn.tenant
    WHERE {claimable} AND due_at <= now() AND coalesce(input_version, 0) <= %(reads)s
    ORDER BY due_at LIMIT 1 FOR UPDATE OF jobs SKIP LOCKED
), claimed AS (
    {claim}
), taken AS (
    INSERT INTO shares (tenant, start, finish)
    SELECT turn.tenant, turn.start, turn.start + 1.0 / turn.weight FROM turn WHERE EXISTS (SELECT FROM claimed)
    ON CONFLICT (tenant) DO UPDATE
    SET start = greatest(shares.finish, EXCLUDED.start),
        finish = greatest(shares.finish, EXCLUDED.start) + (EXCLUDED.finish - EXCLUDED.start)
)
SELECT * FROM claimed
"""


def claim(claimable: str, update: str) -> str:
    """The claim statement that takes the next fair turn: `update` (the claim's UPDATE of `WHERE id = {chosen}`)."""
    return TURN.format(claimable=claimable, claim=update.format(chosen="(SELECT id FROM chosen)").strip())
