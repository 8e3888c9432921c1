"""A file of the artifact store as the gateway answers with it: the file, or a redirect to its presigned URL."""

from __future__ import annotations

import pathlib

from castad_api import served
from fastapi.responses import FileResponse


def test_a_local_file_is_answered_under_its_offered_name_and_a_presigned_url_by_a_temporary_redirect(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "video-0123456789abcdef.mp4"
    path.write_bytes(b"frames")

    local = served.file(path, "video/mp4", "pipeline-video")
    remote = served.file("https://bucket.example/video?X-Amz-Signature=s", "video/mp4", "pipeline-video")

    assert isinstance(local, FileResponse) and local.media_type == "video/mp4"
    assert local.headers["content-disposition"] == 'attachment; filename="pipeline-video.mp4"'
    assert (remote.status_code, remote.headers["location"]) == (307, "https://bucket.example/video?X-Amz-Signature=s")
