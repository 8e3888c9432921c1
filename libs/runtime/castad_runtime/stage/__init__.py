"""The stage machine every stage service runs around its provider."""
