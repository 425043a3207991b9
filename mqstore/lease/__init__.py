"""Leases: work queues with per-message acknowledgement and a visibility timeout (docs/lease.md)."""

from mqstore.lease.consumer import Lease, LeaseConsumer, LeasedMessage, open_lease_consumer
from mqstore.lease.errors import ForeignLeaseError, LeaseError, LeaseExpiredError, UnknownLeaseError

__all__ = ["ForeignLeaseError", "Lease", "LeaseConsumer", "LeaseError", "LeaseExpiredError", "LeasedMessage",
           "UnknownLeaseError", "open_lease_consumer"]
