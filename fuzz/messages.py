"""Message fields built from a fuzz input: valid values near every limit, invalid values and odd types, the same for
both codecs (the harnesses build the pure-Python dataclass and the compiled Message from one list of arguments)."""

from __future__ import annotations

from fuzz.provider import Input

TOPIC_ALPHABET = "abcXYZ019_%|-"
TEXT_ALPHABET = "aZ9 \x01\x02=;:é☃\ud800"  # separators, a space, non-ASCII, a lone surrogate
CLEAN_ALPHABET = "aZ9=;:\x00é☃"  # no separator nor space (a \x00 is allowed): long texts the compiled put accepts
TOPIC_LENGTH_MAX = 127
BODY_LENGTH_MAX = 8192  # the harness stores' max_message_size_bytes
KNOWN_TOPICS = ("t0", "t1", "Topic_A", "%RETRY%g", "a|b-c")


class Text(str):
    """A str subclass: exact-type checks in the compiled code must not take it for a str and skip its checks."""


def topic(source: Input):
    kind = source.below(12)
    if kind < 6:
        return KNOWN_TOPICS[kind % len(KNOWN_TOPICS)]
    if kind == 6:
        return "x" * source.pick((TOPIC_LENGTH_MAX - 1, TOPIC_LENGTH_MAX, TOPIC_LENGTH_MAX + 1, 255, 256))
    if kind == 7:
        return source.text(TOPIC_LENGTH_MAX + 2, TOPIC_ALPHABET)
    if kind == 8:
        return source.text(16)
    if kind == 9:
        return Text(source.pick(KNOWN_TOPICS))
    return source.pick(("", None, b"t0", 7, "t\x00", "tópico"))


def body(source: Input):
    kind = source.below(10)
    if kind < 5:
        return source.blob(64)
    if kind == 5:
        return bytes(source.pick((BODY_LENGTH_MAX - 200, BODY_LENGTH_MAX - 1, BODY_LENGTH_MAX, BODY_LENGTH_MAX + 1)))
    if kind == 6:
        return bytearray(source.blob(32))
    if kind == 7:
        return memoryview(source.blob(32))
    return source.pick(("text", None, 5, b"", memoryview(b"abcdef")[::2]))


def tags(source: Input):
    kind = source.below(8)
    if kind < 3:
        return None
    if kind < 6:
        return source.text(24, TEXT_ALPHABET if source.flag() else CLEAN_ALPHABET)
    return source.pick(("", "TagA", Text("TagB"), 5, b"tag"))


def keys(source: Input):
    kind = source.below(8)
    if kind < 3:
        return ()
    if kind < 6:
        alphabet = TEXT_ALPHABET if source.flag() else CLEAN_ALPHABET
        values = [source.text(20, alphabet) for _ in range(source.below(4) + 1)]
        return values if source.flag() else tuple(values)
    return source.pick(("k1", b"k1", [1], ["a b"], [""], None, ("k", None)))


DELAYED_NAMES = ("DELAY", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS", "TIMER_OUT_MS", "REAL_TOPIC",
                 "REAL_QID")
# Values of those: accepted ones are short delays (a timer past the wheel's roll window would be re-put by the
# timer service in its thread, at a time the harness does not control), the rest refused or taken as "now"
DELAYED_VALUES = ("0", "1", "3", "18", "19", "-1", "+2", "007", "x", "", " 1", "1" * 20, "2147483648",
                  "9223372036854775807", "-9223372036854775808", "1700000000005", "1700000000000", Text("2"), 2)


def delayed(source: Input) -> dict:
    """Properties of a delayed message (delay level, timer), valid or not, with a user property or not."""
    found = {source.pick(DELAYED_NAMES): source.pick(DELAYED_VALUES) for _ in range(source.below(3) + 1)}
    if source.flag():
        found[source.text(4, TEXT_ALPHABET)] = source.text(4, TEXT_ALPHABET)
    return found


def properties(source: Input):
    kind = source.below(10)
    if kind >= 8:
        return delayed(source)
    if kind < 3:
        return {}
    if kind < 6:  # up to 16 entries: past the 24 texts the compiled plan keeps
        alphabet = TEXT_ALPHABET if source.flag() else CLEAN_ALPHABET
        count = source.below(16) + 1 if source.below(4) == 0 else source.below(3) + 1
        return {source.text(12, alphabet): source.text(20, alphabet) for _ in range(count)}
    return source.pick(({"TAGS": "x"}, {"KEYS": "k"}, {1: "a"}, {"a": 1}, None, [("a", "b")], {"": ""},
                        {"UNIQ_KEY": "u"}, {"a" * 40000: "b"}))


def integer(source: Input, common: tuple, odd: tuple):
    kind = source.below(8)
    if kind < 4:
        return source.pick(common)
    if kind < 6:
        return source.uint(8) - (1 << 63) if source.flag() else source.uint(4) - (1 << 31)
    return source.pick(odd)


QUEUE_IDS = (0, 1, 2, 3, 7)
QUEUE_IDS_ODD = (8, 9, -1, 1 << 31, 1 << 63, True, 1.0, None, "1")  # the harness stores allow 8 queues
FLAGS = (0, 1, -1, (1 << 31) - 1)
FLAGS_ODD = (1 << 31, -(1 << 31), -(1 << 31) - 1, 1 << 63, True, 1.5, None)
BORN = (None, 0, 1_700_000_000_000, (1 << 63) - 1)
BORN_ODD = (-1, -(1 << 63), 1 << 63, 1.5, "x", True)


def arguments(source: Input) -> tuple[tuple, dict]:
    """The positional and keyword arguments of one Message."""
    values = dict(topic=topic(source), body=body(source), queue_id=integer(source, QUEUE_IDS, QUEUE_IDS_ODD),
                  tags=tags(source), keys=keys(source), properties=properties(source),
                  flag=integer(source, FLAGS, FLAGS_ODD), born_timestamp_ms=integer(source, BORN, BORN_ODD))
    given = source.below(256)  # which fields are given (the rest take their defaults)
    kwargs = {name: value for bit, (name, value) in enumerate(values.items()) if bit < 2 or given >> bit & 1}
    positional = source.below(3)  # topic and body positional, or only topic, or neither
    names = list(kwargs)[:positional]
    return tuple(kwargs.pop(name) for name in names), kwargs
