"""The gateway's administration commands: keys, webhook secrets and tenants.

`python -m castad_api keys | webhook-secrets | tenants`, and the same under castad-admin.
"""
