"""Re-puts: a message the store itself writes again, carrying header fields a producer's put cannot set.

RocketMQ's broker writes some messages a second time from a stored record: the schedule service delivering a
delayed message (ScheduleMessageService.messageTimeup), the timer delivering a timer message, a consumer's
send-back of a failed message to its group's retry or dead-letter topic (SendMessageProcessor.consumerSendMsgBack).
Those copies keep fields of the stored record's header that `Message` does not have:

    FIELD            (commitlog/format.py)   a re-put writes
    SYSFLAG          OFFSET_SYS_FLAG         the stored record's, IPv6 host bits cleared (this store writes IPv4 hosts)
    BORNTIMESTAMP    OFFSET_BORN_TIMESTAMP   the stored record's (`born_timestamp_ms` of the prepared record)
    BORNHOST         OFFSET_BORN_HOST        the stored record's 8 bytes (an IPv6 born host: the store's own)
    STOREHOSTADDRESS OFFSET_STORE_HOST       the store's, as on every record
    RECONSUMETIMES   OFFSET_RECONSUME_TIMES  given by the caller (the send-back adds one)

Everything else is a record as `CommitLog.prepare` + `append_holding_lock` write it: the same checks, the same
properties encoding and record-CRC pair, the same queue offsets, store timestamp, end word and description to the
dispatch thread, so the ConsumeQueue, the index and `check()` see a re-put as any other record.

Off the hot put path on purpose: a re-put is prepared without the put-side `rewrite` hook (a delivered copy keeps
DELAY in its bytes, as RocketMQ's does, and is never scheduled again; the caller decides its topic), and it is
encoded here in Python into the segment's mapping, never by the compiled codec, so both codec paths write the
same bytes by construction (tests/unit/commitlog/test_reput.py holds them to it).
"""

from __future__ import annotations

from typing import NamedTuple

from mqstore.commitlog import format as fmt
from mqstore.commitlog.commitlog import DESCRIBED_TAIL_BYTES_MAX
from mqstore.commitlog.errors import InvalidMessageError
from mqstore.commitlog.write_batch import PreparedRecord

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_HOST_V6_BITS = fmt.SYS_FLAG_BORNHOST_V6 | fmt.SYS_FLAG_STOREHOST_V6
_WRITABLE_SYS_FLAG_BITS = 0xFFFFFFFF & ~_HOST_V6_BITS


class ReputHeader(NamedTuple):
    """The header fields a re-put carries over (module docstring)."""

    sys_flag: int
    born_host_raw: bytes
    reconsume_times: int


def header_of(stored, store_born_host_raw: bytes, *, reconsume_times: int | None = None) -> ReputHeader:
    """The ReputHeader that keeps a stored message's fields (`reconsume_times` given: that count instead).

    An IPv6 born host cannot be written in this store's IPv4 layout: the store's own born host stands in and the
    IPv6 bits of SYSFLAG are cleared.
    """
    sys_flag = stored.sys_flag
    born_host = stored.born_host_raw
    if sys_flag & fmt.SYS_FLAG_BORNHOST_V6 or len(born_host) != fmt.HOST_V4_LENGTH:
        born_host = store_born_host_raw
    count = stored.reconsume_times if reconsume_times is None else reconsume_times
    return ReputHeader(sys_flag & ~_HOST_V6_BITS, bytes(born_host), count)


def check_header(header: ReputHeader) -> None:
    """InvalidMessageError unless the fields fit the v1 IPv4 header."""
    sys_flag, born_host_raw, reconsume_times = header
    if type(sys_flag) is not int or not INT32_MIN <= sys_flag <= INT32_MAX or sys_flag & _HOST_V6_BITS:
        raise InvalidMessageError(f"sys_flag must be a 32-bit int without the IPv6 host bits, got {sys_flag!r}")
    if not isinstance(born_host_raw, bytes) or len(born_host_raw) != fmt.HOST_V4_LENGTH:
        raise InvalidMessageError(f"born_host_raw must be {fmt.HOST_V4_LENGTH} bytes, got {born_host_raw!r}")
    if type(reconsume_times) is not int or not 0 <= reconsume_times <= INT32_MAX:
        raise InvalidMessageError(f"reconsume_times must be an int in 0..{INT32_MAX}, got {reconsume_times!r}")


def prepare_reput(log, message, header: ReputHeader) -> tuple[PreparedRecord, ReputHeader]:
    """Check and encode a re-put without the put-side rewrite hook; nothing is written."""
    check_header(header)
    return log.prepare(message, hooked=False), header


def append_reput_holding_lock(log, record: PreparedRecord, header: ReputHeader) -> tuple[int, int, int]:
    """Append a prepared re-put for a caller holding `log.lock`: (commitlog_offset, queue_offset, store ts).

    `CommitLog.append_holding_lock`'s pure-Python branch with the header fields of `header`, always into the
    mapping (no write-through scratch), and the same bookkeeping after it.
    """
    queue_key, flag, body, crc, born, tail, size = record
    sys_flag, born_host_raw, reconsume_times = header
    offset = log._end
    if offset + size + fmt.END_FILE_MIN_BLANK_LENGTH > log._append_limit:
        offset = log._roll(offset, size)
    at = offset - log._segment_base
    view = log._view
    queue_offset = log.queue_offsets.get(queue_key, 0)
    store_ts = log.now_ms()
    body_end = at + fmt.HEADER_SIZE + len(body)
    fmt.HEADER_V1.pack_into(view, at, size, fmt.MESSAGE_MAGIC_CODE, crc, queue_key[1], flag, queue_offset, offset,
                            sys_flag, store_ts if born is None else born, born_host_raw, store_ts,
                            log.store_host_raw, reconsume_times, 0, len(body))
    view[at + fmt.HEADER_SIZE : body_end] = body
    end = at + size
    view[body_end:end] = tail
    if log.record_crc:
        covered = fmt.crc32(view[at : end - fmt.RECORD_CRC_LENGTH]) & 0x7FFFFFFF
        view[end - fmt.RECORD_CRC_DIGITS - 1 : end - 1] = fmt.record_crc_digits(covered)
    log.queue_offsets[queue_key] = queue_offset + 1
    log.last_store_timestamp_ms = store_ts
    written = log.written_records
    if written is not None and len(tail) <= DESCRIBED_TAIL_BYTES_MAX and sys_flag == 0:  # a description says
        written.append((offset, size, queue_key, queue_offset, store_ts, tail))  # sys_flag 0: else parsed
    log.set_end(offset + size)
    return offset, queue_offset, store_ts

