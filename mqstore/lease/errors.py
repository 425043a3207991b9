"""What a lease operation refuses. Each is a StoreError; nothing is written when one is raised.

    StoreError
    └── LeaseError
        ├── UnknownLeaseError   no such lease: never handed out, or already acknowledged
        ├── LeaseExpiredError   its visibility timeout passed (the message may be handed out again)
        └── ForeignLeaseError   handed out by a consumer of another (topic, group)
"""

from __future__ import annotations

from mqstore.commitlog.errors import StoreError


class LeaseError(StoreError):
    """A lease operation was refused; nothing was written."""


class UnknownLeaseError(LeaseError):
    """The lease is not one this group handed out, or it was already acknowledged."""


class LeaseExpiredError(LeaseError):
    """The lease's visibility timeout passed: the message is receivable again (or was received again)."""


class ForeignLeaseError(LeaseError):
    """The lease belongs to another (topic, group)."""
