"""Turns a fuzz input into values: the harnesses read their choices from it, so that a mutation of the input is a
mutation of the messages and call sequences built from it. Independent of atheris (the test replays inputs
without it); an input that runs out gives zeros, as atheris's FuzzedDataProvider does."""

from __future__ import annotations


class Input:
    """A cursor over one fuzz input."""

    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    @property
    def left(self) -> int:
        return len(self.data) - self.at

    def take(self, count: int) -> bytes:
        chunk = self.data[self.at : self.at + count]
        self.at += len(chunk)
        return chunk

    def uint(self, byte_count: int) -> int:
        return int.from_bytes(self.take(byte_count).ljust(byte_count, b"\0"), "big")

    def below(self, bound: int) -> int:
        """An int in [0, bound)."""
        return self.uint(1 if bound <= 0x100 else 2 if bound <= 0x10000 else 4) % bound

    def flag(self) -> bool:
        return self.uint(1) & 1 == 1

    def pick(self, choices):
        return choices[self.below(len(choices))]

    def blob(self, length_max: int) -> bytes:
        return self.take(self.below(length_max + 1))

    def text(self, length_max: int, alphabet: str | None = None) -> str:
        raw = self.blob(length_max)
        if alphabet is not None:
            return "".join(alphabet[b % len(alphabet)] for b in raw)
        return raw.decode("utf-8", "replace")
