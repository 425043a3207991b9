"""The tier: sealed segments of a store, and the queue and index files they complete, in an object store under one
prefix, laid out as a RocketMQ store and listed by a manifest (docs/tier.md)."""
