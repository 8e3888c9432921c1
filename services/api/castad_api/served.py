"""A file of the artifact store as an answer: the file itself, or a redirect to the object store's presigned URL."""

from __future__ import annotations

import pathlib

from fastapi import status
from fastapi.responses import FileResponse, RedirectResponse, Response


def file(where: pathlib.Path | str, media_type: str, name: str) -> Response:
    """Answer with a stored file, or with a 307 to its presigned URL.

    `where` is a local path, offered as `name` and its suffix, or a presigned URL, as the store's `serve` or
    `serve_image` gave it.
    """
    if isinstance(where, str):
        return RedirectResponse(where, status_code=status.HTTP_307_TEMPORARY_REDIRECT)
    return FileResponse(where, media_type=media_type, filename=f"{name}{where.suffix}")
