"""What a fault run does: how much traffic, how long each fault lasts, how the services are set.

`FULL` is `make faults`; `SHORT` is the version `make test` runs: every fault kind once and every
invariant, outages shortened, the kills and the database outages of every service at once, and no
quiet phase (the handoffs it measures belong to `make faults`). Every service runs in `REPLICAS`
processes on a three-node RabbitMQ cluster and a PostgreSQL primary with two synchronous standbys. The
lyric and video stages run their local providers (real lyrics and MP4, at a small size), the song
stage a music API (the fake sunoapi.org server, submit then poll), each behind the fault injector,
with settings that make retries and leases quick, so that a run takes minutes, not hours.
"""

from __future__ import annotations

import dataclasses

from castad_contracts import topology


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    pipelines: int  # at least this many accepted before the traffic stops
    rate_per_s: float  # briefs submitted per second while faults run
    outage_s: float  # each database outage
    broker_cut_s: float  # every broker connection dropped and refused this long
    broker_stall_s: float  # broker connections open but silent this long
    partition_s: float  # a network partition from the broker (0: none; heals only at heartbeat timeouts)
    settle_s: float  # the promise: every pipeline terminal within this after the last fault ended
    quiet_pipelines: int  # submitted while a row is parked and nothing else is injected: handoffs measured (0: none)
    quiet_s: float  # traffic alone once the part a fault hit works again, before the next fault
    together: bool  # a replica of every service killed, and every service's database out, at once
    duplicates: int  # real messages republished as duplicates
    operator_interval_s: float  # an operator cancels a recent pipeline or retries an ended one this often
    node_down_s: float  # a RabbitMQ node killed, or stopped, stays down this long
    relay_freeze_s: float  # the relay that leads the gateway's outbox is stopped (SIGSTOP) this long
    failover_after_s: float  # a killed PostgreSQL primary: its standby is promoted this long after


SHORT = Plan(
    name="short",
    pipelines=100,
    rate_per_s=0.85,
    outage_s=6.0,
    broker_cut_s=6.0,
    broker_stall_s=4.0,
    partition_s=0.0,
    settle_s=120.0,
    quiet_pipelines=0,
    quiet_s=1.0,
    together=True,
    duplicates=20,
    operator_interval_s=3.0,
    node_down_s=6.0,
    relay_freeze_s=12.0,  # twice the relay's lease: a takeover, then the frozen one's waking
    failover_after_s=3.0,
)

FULL = Plan(
    name="full",
    pipelines=1000,
    rate_per_s=0.6,
    outage_s=180.0,
    broker_cut_s=30.0,
    broker_stall_s=10.0,
    partition_s=20.0,
    settle_s=300.0,
    quiet_pipelines=100,
    quiet_s=4.0,
    together=False,
    duplicates=100,
    operator_interval_s=6.0,
    node_down_s=30.0,
    relay_freeze_s=60.0,
    failover_after_s=5.0,
)

STAGES = topology.STAGES
HOLD_EVENTS_S = 15.0
PIPELINE_DEADLINE_S = 900.0  # a safety net: no pipeline of a run should need it
VIDEO_STOP_GRACE_S = 0.5
VIDEO_ATTEMPT_TIMEOUT_S = 30.0  # long renders of the SIGTERM fault must fit; hangs are cancelled at it
RELAY_MAX_PUBLISH_ATTEMPTS = 4
REPLICAS = 2  # processes of every service
LEASE_S = 3.0  # a stage's lease: a replica frozen longer loses its attempt to the other
RELAY_LEASE_S = 6.0  # the relay's lease of an outbox (its default)
STAGE_FREEZE_S = 14.0  # a stage replica stopped mid-attempt this long (over four leases: under the run's traffic
# the other replica may first have to free one of its CASTAD_SONG_CONCURRENCY slots; 10 s once took 10.2 s)
# A song stage's call to the music API waits this long first (the fault injector's latency): a replica frozen
# mid-attempt is then caught before its submit, which the fence must keep from leaving once it wakes.
SONG_CALL_LATENCY_S = 0.5
SONG_S = 2.0  # the music API's time to finish a song
# The music API says "not found" for a task this young (as its users report for fresh tasks): no song job may pay
# for a second song over it (the report's submissions a job).
SONG_LISTED_AFTER_S = 1.0
# PostgreSQL ends a session of any service left idle inside a transaction this long, and a statement of it that
# waits this long for a lock (every service's CASTAD_<SERVICE>_DB_IDLE_IN_TRANSACTION_S and _DB_LOCK_WAIT_S; the
# defaults are 10 s and 5 s too): a process frozen inside a transaction holds its
# row locks no longer than both (a statement it had sent may still be waiting for a lock when it froze).
IDLE_IN_TRANSACTION_S = 10.0
LOCK_WAIT_S = 5.0
FROZEN_IN_TRANSACTION_S = IDLE_IN_TRANSACTION_S + LOCK_WAIT_S + 4.0  # how long such a process stays frozen
# Takeover bounds: from the fault to work done again by another replica, node or host.
RELAY_TAKEOVER_S = 10.0
NODE_TAKEOVER_S = 10.0
NODE_CUT_OFF_TAKEOVER_S = 30.0  # found only by heartbeats (5 s) and keepalives, then a consumer's restart
FAILOVER_TAKEOVER_S = 15.0  # from the promotion
# PostgreSQL's standbys: a commit waits for any one of them, so the loss of one stops no commit. This long, at
# most, for a commit of the harness's own once one was lost (the other acknowledges it at once).
POSTGRES_STANDBYS = 2
STANDBY_LOSS_COMMIT_S = 2.0
# Every standby's clock runs this far ahead of the machine's: the promoted one is a primary whose clock jumped ahead.
STANDBY_CLOCK_AHEAD_S = 5.0
IN_TRANSACTION_RELEASE_S = IDLE_IN_TRANSACTION_S + LOCK_WAIT_S + 2.0  # from the freeze to the session's end


def service_settings(music_api_url: str, music_api_key: str) -> dict[str, str]:
    """Every service's CASTAD_* settings in a fault run, besides where its databases and broker are."""
    stage_settings = {
        "FAULT_FAILURE_RATE": "0.3",  # retryable
        "FAULT_PERMANENT_RATE": "0.01",
        "FAULT_HANG_RATE": "0.02",
        "ATTEMPT_TIMEOUT_S": "4",
        "MAX_ATTEMPTS": "12",
        "BACKOFF_BASE_S": "0.05",
        "BACKOFF_MAX_S": "1",
        "LEASE_S": str(LEASE_S),
        "POLL_S": "0.2",
        "CONCURRENCY": "4",
        "STOP_GRACE_S": "2",
    }
    return {
        "CASTAD_LOG_LEVEL": "INFO",
        "OTEL_TRACES_EXPORTER": "none",
        "CASTAD_HOLD_EVENTS_S": str(HOLD_EVENTS_S),
        "CASTAD_API_PIPELINE_DEADLINE_S": str(PIPELINE_DEADLINE_S),
        "CASTAD_VIDEO_SHORT_SIDE": "144",
        "CASTAD_VIDEO_FPS": "4",
        "CASTAD_RELAY_FALLBACK_POLL_S": "1",
        "CASTAD_RELAY_RETRY_DELAY_S": "0.3",
        "CASTAD_RELAY_PUBLISH_BACKOFF_MAX_S": "2",
        "CASTAD_RELAY_CONFIRM_TIMEOUT_S": "5",
        "CASTAD_RELAY_MAX_PUBLISH_ATTEMPTS": str(RELAY_MAX_PUBLISH_ATTEMPTS),
        "CASTAD_RELAY_LEASE_S": str(RELAY_LEASE_S),
        **{f"CASTAD_{svc.upper()}_DB_IDLE_IN_TRANSACTION_S": str(IDLE_IN_TRANSACTION_S) for svc in topology.SERVICES},
        **{f"CASTAD_{svc.upper()}_DB_LOCK_WAIT_S": str(LOCK_WAIT_S) for svc in topology.SERVICES},
        **{f"CASTAD_{stage.upper()}_{name}": value for stage in STAGES for name, value in stage_settings.items()},
        "CASTAD_SONG_PROVIDER": "suno",
        "CASTAD_SONG_FAULT_LATENCY_S": str(SONG_CALL_LATENCY_S),
        "CASTAD_SONG_SUNO_BASE_URL": music_api_url,
        "CASTAD_SONG_ALLOW_PRIVATE": "true",  # the music API's fake listens on 127.0.0.1, over http
        "CASTAD_SONG_SUNO_API_KEY": music_api_key,
        "CASTAD_SONG_POLL_FIRST_S": "1",
        "CASTAD_SONG_POLL_MAX_S": "2",
        "CASTAD_SONG_PROVIDER_GIVE_UP_S": "60",
        "CASTAD_SONG_QUOTA_RATE_PER_S": "50",
        "CASTAD_SONG_QUOTA_BURST": "50",
        "CASTAD_VIDEO_STOP_GRACE_S": str(VIDEO_STOP_GRACE_S),
        "CASTAD_VIDEO_ATTEMPT_TIMEOUT_S": str(VIDEO_ATTEMPT_TIMEOUT_S),
    }
