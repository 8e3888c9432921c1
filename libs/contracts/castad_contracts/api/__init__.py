"""Request and response bodies of the gateway's REST API (a pipeline's request body is `PipelineRequest`).

The contract is read as one vocabulary, `api.PipelineRequest`, `api.Problem`, `api.Meter`, by the gateway's routes,
the command line client, the benchmarks and the tests (some fifty modules); the modules below are how it is kept, a
part of the API each, and this one names what its readers use (every name in `__all__`, so that mypy's
no_implicit_reexport sees it exported):

- common.py: a resource's links, a refusal's body, the calling key, a reason and a filter;
- files.py: links to a pipeline's files (artifacts, fetched photos, formats, captions);
- pipelines.py: a pipeline's request body, as read and listed, remade, canceled and retried, and its notices;
- reviews.py: a pipeline's drafts, and a person's decision on one;
- timeline.py: a pipeline's timeline, and the stream of every pipeline's entries;
- dead_letters.py: dead letters as an operator lists, replays and discards them;
- images.py: uploaded images, and a tenant's brand kit;
- stats.py: the operator's numbers over a window;
- usage.py: what a tenant used, what it cost, and its budgets.
"""

from castad_contracts.api.common import Caller, Conflict, Links, Problem
from castad_contracts.api.dead_letters import (
    BulkReplayed,
    DeadLetter,
    DeadLetterAction,
    DeadLetterDetail,
    DeadLetterFilter,
    DeadLetterPage,
    Discard,
    Replayed,
)
from castad_contracts.api.files import (
    CAPTION_MEDIA_TYPES,
    FORMAT_OF_SLUG,
    FORMAT_SLUG_PATTERN,
    ArtifactLink,
    CaptionFormat,
    CaptionLink,
    FetchedPhotoLink,
    FormatLink,
)
from castad_contracts.api.images import BrandKit, BrandKitRequest, Image
from castad_contracts.api.pipelines import (
    ENDED,
    ActionAccepted,
    CancelRequest,
    PipelineAccepted,
    PipelinePage,
    PipelineRequest,
    PipelineView,
    RemakeChanges,
    RemakeLink,
    RemakeRequest,
    RetryRequest,
    StageView,
    WebhookDelivery,
    WebhookTry,
)
from castad_contracts.api.reviews import DraftView, ReviewAccepted, ReviewChoice, ReviewDecision, ReviewView
from castad_contracts.api.stats import (
    DeadLetterCounts,
    ErrorCount,
    Percentiles,
    PipelineCounts,
    ReviewCounts,
    StageStats,
    Stats,
    StuckAttempt,
    Throughput,
    ThroughputBucket,
    WaitingReview,
)
from castad_contracts.api.timeline import (
    AttemptView,
    ErrorInfo,
    FirehoseEntry,
    OperatorAction,
    PipelineTimeline,
    TimelineEntry,
)
from castad_contracts.api.usage import Budget, BudgetPeriod, Meter, Meters, Usage, UsageDay, calls_meter

__all__ = [
    "ActionAccepted",
    "ArtifactLink",
    "AttemptView",
    "BrandKit",
    "BrandKitRequest",
    "Budget",
    "BudgetPeriod",
    "BulkReplayed",
    "CAPTION_MEDIA_TYPES",
    "Caller",
    "CancelRequest",
    "CaptionFormat",
    "CaptionLink",
    "Conflict",
    "DeadLetter",
    "DeadLetterAction",
    "DeadLetterCounts",
    "DeadLetterDetail",
    "DeadLetterFilter",
    "DeadLetterPage",
    "Discard",
    "DraftView",
    "ENDED",
    "ErrorCount",
    "ErrorInfo",
    "FORMAT_OF_SLUG",
    "FORMAT_SLUG_PATTERN",
    "FetchedPhotoLink",
    "FirehoseEntry",
    "FormatLink",
    "Image",
    "Links",
    "Meter",
    "Meters",
    "OperatorAction",
    "Percentiles",
    "PipelineAccepted",
    "PipelineCounts",
    "PipelinePage",
    "PipelineRequest",
    "PipelineTimeline",
    "PipelineView",
    "Problem",
    "RemakeChanges",
    "RemakeLink",
    "RemakeRequest",
    "Replayed",
    "RetryRequest",
    "ReviewAccepted",
    "ReviewChoice",
    "ReviewCounts",
    "ReviewDecision",
    "ReviewView",
    "StageStats",
    "StageView",
    "Stats",
    "StuckAttempt",
    "Throughput",
    "ThroughputBucket",
    "TimelineEntry",
    "Usage",
    "UsageDay",
    "WaitingReview",
    "WebhookDelivery",
    "WebhookTry",
    "calls_meter",
]
