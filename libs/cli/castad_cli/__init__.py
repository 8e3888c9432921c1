"""`castad`: submit a brief, watch its progress live, show its status."""
