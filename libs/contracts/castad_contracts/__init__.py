"""Castad's shared vocabulary: event envelope, payloads, API brief and topology.

This package holds no business logic; every service depends on it and on nothing
of another service.
"""
