"""Local servers that behave like the network providers' documented APIs, for tests and offline runs."""
