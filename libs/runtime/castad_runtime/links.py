"""Links of the gateway that a network provider may use without an API key, each signed by one stage.

A provider cannot send Castad's API key: the song it must fetch (a render API) and the callback
it makes when its work moves on are links with an expiry and an HMAC-SHA256 signature.

Keys, least privilege: the gateway holds the one root secret (CASTAD_API_LINK_SECRET); a stage
that signs links holds only its own key (CASTAD_SONG_LINK_SECRET, CASTAD_VIDEO_LINK_SECRET),
derived from the root with HKDF (RFC 5869) and the stage's name, so one stage's key signs no
other stage's links, and the root never leaves the gateway (`python -m castad_api link-secrets`
prints the stages' keys). Each link is signed with a key derived again from the stage's for its
purpose, so the song stage's callbacks sign no file link. The lyric stage signs nothing and has
no key. Who signs what, which the gateway checks:

- `/v1/provider-callbacks/{stage}/{pipeline}`: `stage` (song, video), purpose `callback`;
- `/v1/links/pipelines/{pipeline}/artifacts/song`: video (its render API fetches the song),
  purpose `artifact`; no other stage's file has a link;
- `/v1/links/pipelines/{pipeline}/photos/{image}`: video (its render API fetches the brief's
  uploaded photos), purpose `photo`; the gateway opens it only for an image that pipeline's brief
  names, of the pipeline's tenant;
- `/v1/links/pipelines/{pipeline}/review/{draft}`: the gateway itself, with a key of its own derived
  from the root, purpose `review`: the link of a `review.requested` notice, which shows that one
  draft and takes one decision on it, until the draft's review times out.

The gateway refuses a link for another path, altered, expired, or whose expiry is further off
than it allows (CASTAD_API_LINK_MAX_S): a stage signs for its provider's give-up time and
MARGIN_S, no longer.

The same keys seal the photos a brief names (`photo_seal`): the gateway seals each for its
pipeline with the video stage's key, and the video stage uses no photo whose seal does not hold,
so the lyric and song stages, which pass the brief on and hold no such key, cannot slip another
pipeline's (another tenant's) photo into a video, by reference or by a URL of the store.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import time
import urllib.parse

from castad_contracts import brief, events
from pydantic import SecretStr

MARGIN_S = 3600.0  # a link outlives its provider's give-up time by this much (a late callback is harmless)
_SALT = b"castad links v1"
_CALLBACK = re.compile(r"^/v1/provider-callbacks/(?P<stage>song|video)/[^/]+$")
_ARTIFACT = re.compile(r"^/v1/links/pipelines/[^/]+/artifacts/(?P<stage>song)$")
_PHOTO = re.compile(r"^/v1/links/pipelines/[^/]+/photos/[^/]+$")
_REVIEW = re.compile(r"^/v1/links/pipelines/[^/]+/review/[^/]+$")
GATEWAY = "gateway"  # the signer of the links to review a draft: the gateway, with a key of its own
REVIEW_LINK_MAX_S = brief.MAX_REVIEW_TIMEOUT_S + MARGIN_S  # a review link lives as long as its draft's review
FILE_SIGNER = {events.Stage.SONG: events.Stage.VIDEO}  # a stage's file: the stage whose provider fetches it
SIGNERS = (events.Stage.SONG, events.Stage.VIDEO)  # the stages that sign links, each with a key of its own


class Purpose(enum.StrEnum):
    """What a link is for; a stage's key for one purpose signs no link for another."""

    CALLBACK = "callback"
    ARTIFACT = "artifact"
    PHOTO = "photo"
    REVIEW = "review"
    SEAL = "seal"  # not a link: an uploaded photo of a brief, sealed for its pipeline (`photo_seal`)


def hkdf(key: bytes, *, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869): extract with `salt`, expand to `length` bytes for `info`."""
    prk = hmac.new(salt, key, hashlib.sha256).digest()
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


def stage_secret(root: SecretStr, stage: events.Stage | str) -> SecretStr:
    """The key of one stage (hex), derived from the gateway's root secret; the gateway's own for GATEWAY."""
    info = (GATEWAY if stage == GATEWAY else f"stage:{events.Stage(stage).value}").encode()
    return SecretStr(hkdf(root.get_secret_value().encode(), salt=_SALT, info=info).hex())


def signature(secret: SecretStr, purpose: Purpose, path: str, expires: int) -> str:
    """A link's signature under a stage's key (`secret`) for `purpose`."""
    key = hkdf(secret.get_secret_value().encode(), salt=_SALT, info=f"purpose:{purpose.value}".encode())
    return hmac.new(key, f"{path}\n{expires}".encode(), hashlib.sha256).hexdigest()


def sign(base_url: str, path: str, secret: SecretStr, purpose: Purpose, valid_s: float) -> str:
    """`base_url` + `path` with its expiry and signature (a stage's key, for `purpose`) as query parameters."""
    expires = int(time.time() + valid_s)
    query = urllib.parse.urlencode({"expires": expires, "signature": signature(secret, purpose, path, expires)})
    return f"{base_url.rstrip('/')}{path}?{query}"


def photo_seal(secret: SecretStr, pipeline_id: str, photo: brief.PhotoV1 | brief.PhotoLinkV1) -> str:
    """The seal of a photo a brief names, for one pipeline, under the video stage's key (`secret`).

    The gateway seals each photo a brief names when it accepts the pipeline (with the video stage's key, derived from
    its root), an upload by all that names its file, a photo named by URL by its URL, and the video stage checks it
    before it uses the photo. The lyric and song stages, which pass the brief on, hold no such key: they cannot name
    another pipeline's (another tenant's) photo, by reference or by a URL of the store, nor change one.
    """
    named: tuple[str, ...]
    if isinstance(photo, brief.PhotoV1):
        named = ("upload", photo.id, photo.owner, photo.sha256, photo.media_type, str(photo.size))
    else:
        named = ("url", photo.url)
    return signature(secret, Purpose.SEAL, "\n".join((pipeline_id, *named)), 0)


def sealed(
    root: SecretStr, pipeline_id: str, photos: tuple[brief.Photo | brief.PhotoLink, ...]
) -> tuple[brief.Photo | brief.PhotoLink, ...]:
    """The brief's photos each sealed for the pipeline, as the gateway names them (its root secret)."""
    secret = stage_secret(root, events.Stage.VIDEO)
    return tuple(photo.model_copy(update={"seal": photo_seal(secret, pipeline_id, photo)}) for photo in photos)


def seal_holds(secret: SecretStr, pipeline_id: str, photo: brief.Photo | brief.PhotoLink) -> bool:
    """Whether a photo a brief names carries the gateway's seal for this pipeline (`secret`: the video's key)."""
    return photo.seal is not None and hmac.compare_digest(photo_seal(secret, pipeline_id, photo), photo.seal)


def stage_keys(root: SecretStr) -> dict[str, str]:
    """Each signing stage's key, derived from the gateway's root, as the variable that sets it."""
    return {
        f"CASTAD_{stage.value.upper()}_LINK_SECRET": stage_secret(root, stage).get_secret_value() for stage in SIGNERS
    }


def review_link(root: SecretStr, pipeline_id: str, draft_id: str, expires: int) -> str:
    """The gateway's link to one draft of a pipeline's review (a path and its query), valid until `expires`.

    The same link for the same draft and expiry: a notice sent again carries it unchanged."""
    path = f"/v1/links/pipelines/{pipeline_id}/review/{draft_id}"
    given = signature(stage_secret(root, GATEWAY), Purpose.REVIEW, path, expires)
    return f"{path}?{urllib.parse.urlencode({'expires': expires, 'signature': given})}"


def signer(path: str) -> tuple[events.Stage | str, Purpose] | None:
    """The stage (or GATEWAY) that signs links for `path`, and for which purpose; None for a path no link is for."""
    if found := _CALLBACK.match(path):
        return events.Stage(found["stage"]), Purpose.CALLBACK
    if found := _ARTIFACT.match(path):
        return FILE_SIGNER[events.Stage(found["stage"])], Purpose.ARTIFACT
    if _PHOTO.match(path):
        return events.Stage.VIDEO, Purpose.PHOTO
    if _REVIEW.match(path):
        return GATEWAY, Purpose.REVIEW
    return None


def accepted(root: SecretStr, path: str, expires: int, given: str, *, max_s: float) -> bool:
    """Whether the gateway takes a link.

    Signed for this very path by the stage that signs it, for its purpose, not expired, and expiring within
    `max_s` (a review link: within REVIEW_LINK_MAX_S, as long as a draft may wait).
    """
    who = signer(path)
    now = time.time()
    if who is not None and who[1] is Purpose.REVIEW:
        max_s = REVIEW_LINK_MAX_S  # as long as the draft's review may wait
    if who is None or not now <= expires <= now + max_s:
        return False
    stage, purpose = who
    return hmac.compare_digest(signature(stage_secret(root, stage), purpose, path, expires), given)
