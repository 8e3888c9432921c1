"""Briefs submitted at a steady rate, each until accepted, as a careful client does.

A POST that fails (the gateway killed, its database out, the connection reset) is sent
again with the same Idempotency-Key until a 202 comes back, so a request the gateway
accepted but whose answer was lost is not submitted twice. With several gateway replicas,
briefs take turns among them and a POST sent again goes to the next one, as a load balancer
that drops a replica that does not answer would send it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
from collections.abc import Mapping, Sequence

import httpx
from castad_testkit import briefs

GIVE_UP_S = 900.0  # no fault of a run keeps the gateway away this long


class Stopped(Exception):
    """The traffic stopped while a brief was still being sent again: it was given up (never accepted)."""


@dataclasses.dataclass
class Accepted:
    pipeline_id: str
    key: str
    first_sent: float  # wall clock (time.time()) of the first POST
    accepted: float  # wall clock of the 202
    tries: int


class Submitter:
    """Submits briefs at `rate_per_s` on a thread of its own until stopped, to the gateways at `base_urls`."""

    def __init__(
        self, base_urls: Sequence[str], rate_per_s: float, prefix: str, api_key: str, photos: Sequence[str] = ()
    ) -> None:
        self.base_urls = list(base_urls)
        self.photos = list(photos)  # uploaded images every other brief names
        self.auth = {"Authorization": f"Bearer {api_key}"}
        self.rate_per_s = rate_per_s
        self.prefix = prefix
        self.accepted: list[Accepted] = []
        self.refusals: dict[str, int] = {}  # what answered a POST that was sent again: "503", "connection", ...
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"submitter-{prefix}", daemon=True)
        self._next = 0
        self._lock = threading.Lock()

    def start(self) -> Submitter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def submit(self, duration_s: int | None = None) -> Accepted:
        """One brief, sent until accepted (on the caller's thread)."""
        with self._lock:
            number = self._next
            self._next += 1
        body = briefs.sample(number=number, duration_s=duration_s).model_dump(mode="json")
        if self.photos and number % 2:
            body["photos"] = self.photos
        key = f"{self.prefix}-{number}"
        first = time.time()
        tries = 0
        with httpx.Client(timeout=10, headers=self.auth) as http:
            while True:
                tries += 1
                if time.time() - first > GIVE_UP_S:
                    raise RuntimeError(f"brief {key} not accepted within {GIVE_UP_S} s")
                if self._stop.is_set() and tries > 1:
                    raise Stopped(f"brief {key} given up: the traffic stops")
                gateways = self.targets()
                gateway = gateways[(number + tries - 1) % len(gateways)]
                try:
                    response = http.post(f"{gateway}/v1/pipelines", json=body, headers={"Idempotency-Key": key})
                except httpx.HTTPError:
                    self._refused("connection")
                else:
                    if response.status_code == 202:
                        done = Accepted(response.json()["id"], key, first, time.time(), tries)
                        with self._lock:
                            self.accepted.append(done)
                        return done
                    if response.status_code < 500:
                        raise RuntimeError(f"brief {key} refused: {response.status_code} {response.text}")
                    self._refused(str(response.status_code))
                time.sleep(min(0.2 * tries, 2.0))

    def targets(self) -> list[str]:
        """The gateways to send to now (a rolling upgrade changes them)."""
        return self.base_urls

    def _refused(self, what: str) -> None:
        with self._lock:
            self.refusals[what] = self.refusals.get(what, 0) + 1

    def _run(self) -> None:
        started = time.monotonic()
        sent = 0
        while not self._stop.is_set():
            try:
                self.submit()
            except Stopped:
                return
            sent += 1
            ahead = started + sent / self.rate_per_s - time.monotonic()
            if ahead > 0:
                self._stop.wait(ahead)


@dataclasses.dataclass(frozen=True)
class Action:
    kind: str  # cancel or retry
    pipeline_id: str
    at: float
    answer: int  # HTTP status


class Operator:
    """An operator at random: every `interval_s`, cancels a recent pipeline or retries an ended one."""

    def __init__(self, submitter: Submitter, interval_s: float, seed: int = 7) -> None:
        self.submitter = submitter
        self.interval_s = interval_s
        self.actions: list[Action] = []
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator", daemon=True)

    def start(self) -> Operator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        headers = {"X-Castad-Actor": "fault-harness", **self.submitter.auth}
        turn = 0
        while not self._stop.wait(self.interval_s):
            turn += 1
            gateways = self.submitter.targets()
            gateway = gateways[turn % len(gateways)]
            # The gateway down or its database out: the next turn tries again.
            with (
                httpx.Client(base_url=gateway, timeout=5, headers=headers) as http,
                contextlib.suppress(httpx.HTTPError, ValueError),
            ):
                self._act(http)

    def _act(self, http: httpx.Client) -> None:
        if self._rng.random() < 0.5:
            recent = [a.pipeline_id for a in self.submitter.accepted[-20:]]
            if recent:
                self._post(http, "cancel", self._rng.choice(recent), {"reason": "the fault harness changed its mind"})
            return
        ended = http.get("/v1/pipelines", params={"status": self._rng.choice(["FAILED", "CANCELED"]), "limit": 20})
        items = ended.json().get("items", []) if ended.status_code == 200 else []
        if items:
            budget = {"max_attempts": {"video": 20}} if self._rng.random() < 0.5 else {}
            self._post(http, "retry", self._rng.choice(items)["id"], budget)

    def _post(self, http: httpx.Client, kind: str, pipeline_id: str, body: Mapping[str, object]) -> None:
        answer = http.post(f"/v1/pipelines/{pipeline_id}/{kind}", json=body)
        if answer.status_code in (202, 409):  # 409: it ended meanwhile, or is not retryable any more
            self.actions.append(Action(kind, pipeline_id, time.time(), answer.status_code))
