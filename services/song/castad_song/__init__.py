"""Song stage: turns lyrics into a sung WAV."""
