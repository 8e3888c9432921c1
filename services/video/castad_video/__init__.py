"""Video stage: turns a song and its lyrics into an MP4 with captions."""
