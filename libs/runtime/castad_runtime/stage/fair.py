"""Fair turns across tenants: what a claim takes when several tenants' jobs wait for the stage.

Jobs wait for whatever limits a stage: its workers, its provider's quota (a token for each call), its cap on jobs at
the provider. Taken oldest first, one tenant's backlog of hundreds would hold every other tenant's work back until
it is through. So a claim takes turns across tenants instead (start-time fair queueing, with the claims as the
turns):

- Each tenant whose jobs are due has a place in a virtual time: `finish`, its `shares` row's, where its next claim
  may start at the earliest. The claim takes the due tenant whose next claim starts first: at its `finish`, or at
  the clock (the latest start any claim took) if its `finish` is behind it; ties go to the tenant served least
  lately (the lower `finish`), then by name. Within the tenant, its oldest due job, as before.
- The claim moves the tenant's start there and its `finish` on by `1 / weight` (the claimed job's
  `events.Share.weight`). So two waiting tenants alternate; one of weight 3 gets three turns for the other's one.
- A tenant that was idle starts at the clock: its idle time is not saved up as turns to take from the others later.
  A new tenant's first job waits for at most one turn of each other waiting tenant.

What the claim keeps: it is the same compare-and-set under a lease (`repository.claiming.claim_next`), on the job that
`FOR UPDATE SKIP LOCKED` gives it, and the quota's token is spent as before. Two claims at once may choose the same
tenant; each then takes another of its jobs, and its `shares` row (updated by both, the second after the first
commits) moves on by both turns. A tenant whose due jobs other claims hold at that instant is passed over for the
next: a claim finds work while any is due that no other claim holds. Claims of one tenant wait for each other's
commit on its `shares` row while another tenant waits too; a tenant waiting alone takes its claims without moving
its place (its turns then matter to no one), so a single tenant's claims go as fast as before fair turns.

A trigger whose handler finds a free slot of its stage (one that no provider's quota limits) claims its own job at
once, as before: a slot is free, so no job waits for one. A job whose trigger told no share (written by a release
before) belongs to tenant '' of weight 1: it takes its turns as one more tenant. A `shares` row is a tenant's, kept
for good (a few bytes each).
"""

from __future__ import annotations

# The tenants with claimable jobs are found by a loose scan of the index jobs_fair (tenant, due_at), one probe a
# tenant, not one a job. Ranked by where their next claim starts, they are read in that order (a MATERIALIZED CTE
# keeps its rows' order), and the first with a due job no other claim holds gives its oldest: the LATERAL runs
# tenant after tenant (one probe each: the index's range up to now) until one does (LIMIT 1), locking only that
# job, so a claim finds work while any is due that no other claim holds.
# `{claimable}` names the statuses a claim may take; `{claim}` is the claim's UPDATE (repository.claiming._UPDATE),
# given the chosen job's id. With a single tenant waiting, its place is not moved: no row every claim would wait for.
TURN = """
WITH RECURSIVE waiting AS (
    (SELECT tenant FROM jobs WHERE status IN ('PENDING', 'RETRY_WAIT', 'AWAITING') ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT tenant FROM jobs WHERE status IN ('PENDING', 'RETRY_WAIT', 'AWAITING')
                AND jobs.tenant > waiting.tenant ORDER BY tenant LIMIT 1)
    FROM waiting WHERE waiting.tenant IS NOT NULL
), clock AS (
    SELECT coalesce(max(start), 0) AS now FROM shares
), ranked AS MATERIALIZED (
    SELECT waiting.tenant, greatest(coalesce(shares.finish, 0), clock.now) AS start,
        coalesce(shares.finish, 0) AS finish
    FROM waiting CROSS JOIN clock LEFT JOIN shares ON shares.tenant = waiting.tenant
    WHERE waiting.tenant IS NOT NULL
    ORDER BY 2, 3, 1
), chosen AS MATERIALIZED (
    SELECT job.id, job.weight, ranked.tenant, ranked.start, (SELECT count(*) FROM ranked) AS waiting
    FROM ranked CROSS JOIN LATERAL (
        SELECT id, weight FROM jobs
        WHERE jobs.tenant = ranked.tenant AND {claimable} AND due_at <= now()
            AND coalesce(input_version, 0) <= %(reads)s
        ORDER BY due_at LIMIT 1 FOR UPDATE SKIP LOCKED
    ) AS job
    LIMIT 1
), claimed AS (
    {claim}
), taken AS (
    INSERT INTO shares (tenant, start, finish)
    SELECT tenant, start, start + 1.0 / weight FROM chosen WHERE waiting > 1 AND EXISTS (SELECT FROM claimed)
    ON CONFLICT (tenant) DO UPDATE
    SET start = greatest(shares.finish, EXCLUDED.start),
        finish = greatest(shares.finish, EXCLUDED.start) + (EXCLUDED.finish - EXCLUDED.start)
)
SELECT * FROM claimed
"""


def claim(claimable: str, update: str) -> str:
    """The claim statement that takes the next fair turn: `update` (the claim's UPDATE of `WHERE id = {chosen}`)."""
    return TURN.format(claimable=claimable, claim=update.format(chosen="(SELECT id FROM chosen)").strip())
