"""A pipeline's review: its drafts as read, and a person's decision on one."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from castad_contracts import brief, events
from castad_contracts.api.common import Links


class DraftView(BaseModel):
    """A draft a stage made for a person to decide on, and what became of it."""

    id: str = Field(description="what a decision names (`draft`)")
    stage: events.Stage
    round: int = Field(description="new drafts asked for before this one")
    text: str = Field(description="the lyrics as a person reads and edits them: the title, then `[verse]` ... lines")
    drafted_at: dt.datetime
    review_until: dt.datetime = Field(description="when it comes to `on_timeout` if no one decided")
    on_timeout: Literal["approve", "cancel"]
    regenerations_left: int = Field(description="new drafts a `regenerate` may still ask for")
    decision: str | None = Field(
        description="approve, edit or regenerate, as a key decided; approve or cancel when it timed out; null while"
        " it waits"
    )
    edited_text: str | None = Field(default=None, description="for edit: the final lyrics, sung as written")
    note: str | None = Field(default=None, description="for regenerate: what it asked to change")
    decided_at: dt.datetime | None = None
    decided_by_key_id: str | None = Field(default=None, description="the key that decided (null: its timeout)")
    expired_at: dt.datetime | None = Field(default=None, description="when it timed out undecided")


class ReviewView(BaseModel):
    """The review a pipeline asked for, and its current draft."""

    asked: brief.Review
    draft: DraftView | None = Field(description="the newest draft (null until the first is made)")


class ReviewChoice(BaseModel):
    """A person's decision on a draft (a notice's link names the draft)."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "edit", "regenerate"] = Field(
        description="approve: the song is made of the draft; edit: of `lyrics` instead, exactly as written;"
        " regenerate: a new draft is written (told `note`, if given)"
    )
    lyrics: str | None = Field(
        default=None,
        max_length=events.MAX_LYRICS_CHARS,
        validate_default=True,
        description="for edit, and only then: the final lyrics as the draft's `text` writes them (a title line,"
        f" then sections: a `[verse]`, `[chorus]` or `[bridge]` line and its lines; at most {events.MAX_SECTIONS}"
        f" sections of {events.MAX_SECTION_LINES} lines of {events.MAX_LINE_CHARS} characters)",
    )
    note: brief.Details | None = Field(
        default=None, max_length=500, description="for regenerate, and only then: what to change (optional)"
    )

    @field_validator("lyrics")
    @classmethod
    def _lyrics_for_edit(cls, lyrics: str | None, info: ValidationInfo) -> str | None:
        decision = info.data.get("decision")
        if decision == "edit" and not (lyrics or "").strip():
            raise ValueError("an edit gives the final lyrics")
        if decision not in ("edit", None) and lyrics is not None:
            raise ValueError(f"only an edit gives lyrics, not {decision}")
        return lyrics

    @field_validator("note")
    @classmethod
    def _note_for_regenerate(cls, note: str | None, info: ValidationInfo) -> str | None:
        decision = info.data.get("decision")
        if decision not in ("regenerate", None) and note is not None:
            raise ValueError(f"only a regenerate gives a note, not {decision}")
        return note


class ReviewDecision(ReviewChoice):
    """A person's decision on a pipeline's current draft."""

    draft: str = Field(pattern=brief.UUID_PATTERN, description="the draft decided on: the pipeline's current one")


class ReviewAccepted(BaseModel):
    """A decision recorded: the stage applies it; the pipeline's status and event stream follow."""

    id: str
    draft: str
    decision: str
    status: str = Field(description="the pipeline's status now (AWAITING_REVIEW until the stage has applied it)")
    links: Links
