"""Lyric stage: turns a brief into song lyrics."""
