"""Golden bytes of an index file, and the constants that tie indexfile.format to RocketMQ's layout."""

from __future__ import annotations

import numpy as np
from mqstore.indexfile import format as fmt
from mqstore.indexfile.index_file import IndexFile
from mqstore.indexfile.index_service import IndexService

T0 = 1_700_000_000_000  # 0x0000018BCFE56800

# 4 slots, room for 4 entries (entry 0 unused). Created inheriting endPhyOffset 1000 and endTimestamp T0, then:
#   "t#a" hash 112658 (0x1B812) slot 2, phy 1000 at T0+2500: timeDiff (T0+2500 - T0)//1000 = 2 (inherited
#         begin), then beginTimestamp := T0+2500
#   "t#b" hash 112659 (0x1B813) slot 3, phy 1200 at T0+5600: timeDiff (5600-2500)//1000 = 3
#   "t#e" hash 112662 (0x1B816) slot 2, phy 1300 at T0+5600: timeDiff 3, prevIndex 1 (slot 2's old head)
GOLDEN = bytes.fromhex(
    # header: beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount, indexCount
    "0000018bcfe571c4" "0000018bcfe57de0" "00000000000003e8" "0000000000000514" "00000003" "00000004"
    # slots 0..3
    "00000000" "00000000" "00000003" "00000002"
    # entries: keyHash, phyOffset, timeDiff, prevIndex
    "00000000" "0000000000000000" "00000000" "00000000"  # entry 0, never written
    "0001b812" "00000000000003e8" "00000002" "00000000"
    "0001b813" "00000000000004b0" "00000003" "00000000"
    "0001b816" "0000000000000514" "00000003" "00000001"
)


def test_constants_and_dtypes():
    assert fmt.INDEX_HEADER.itemsize == 40 and fmt.INDEX_ENTRY.itemsize == 20 and fmt.SLOT.itemsize == 4
    assert all(fmt.INDEX_HEADER.fields[name][0].byteorder == ">" for name in fmt.INDEX_HEADER.names)
    assert all(fmt.INDEX_ENTRY.fields[name][0].byteorder == ">" for name in fmt.INDEX_ENTRY.names)
    assert [fmt.INDEX_HEADER.fields[name][1] for name in fmt.INDEX_HEADER.names] == [0, 8, 16, 24, 32, 36]
    assert [fmt.INDEX_ENTRY.fields[name][1] for name in fmt.INDEX_ENTRY.names] == [0, 4, 12, 16]
    assert fmt.file_size_bytes(fmt.HASH_SLOT_COUNT_DEFAULT, fmt.INDEX_ENTRY_COUNT_MAX_DEFAULT) == 420_000_040
    assert fmt.file_size_bytes(64, 256) == 5416  # the RocketMQ fixture's files


def test_golden_bytes_single_puts(tmp_path):
    index_file = IndexFile.create(str(tmp_path / "20231114221320000"), 4, 4, end_phy_offset=1000,
                                  end_timestamp_ms=T0)
    for key, offset, stamp in (("t#a", 1000, T0 + 2500), ("t#b", 1200, T0 + 5600), ("t#e", 1300, T0 + 5600)):
        assert index_file.put_key(fmt.index_key_hash(key), offset, stamp)
    assert not index_file.put_key(fmt.index_key_hash("t#z"), 1400, T0 + 6000)
    index_file.close()
    assert (tmp_path / "20231114221320000").read_bytes() == GOLDEN


def test_golden_bytes_through_the_service(tmp_path):
    service = IndexService(tmp_path, 4, 4, clock_ms=lambda: T0)
    service.put_keys([b"t#x"], [900], [T0])  # fills file 1 partly; file 2 will inherit its end
    service.put_keys([b"t#y", b"t#z"], [950, 1000], [T0 - 1000, T0])  # file 1 ends at phy 1000, T0
    service.put_keys([b"t#a", b"t#b", b"t#e"], [1000, 1200, 1300], [T0 + 2500, T0 + 5600, T0 + 5600])
    newest = service.files[-1]
    service.close()
    with open(newest.path, "rb") as handle:
        assert handle.read() == GOLDEN


def test_golden_bytes_read_back():
    raw = np.frombuffer(GOLDEN, dtype=np.uint8)
    header = raw[:40].view(fmt.INDEX_HEADER)[0]
    assert header["index_count"] == 4 and header["hash_slot_count"] == 3
    assert header["begin_timestamp_ms"] == T0 + 2500 and header["end_phy_offset"] == 1300
    entries = raw[fmt.entries_offset(4) :].view(fmt.INDEX_ENTRY)
    assert entries["prev_index"].tolist() == [0, 0, 0, 1]
    assert fmt.HEADER_STRUCT.unpack_from(GOLDEN, 0) == (T0 + 2500, T0 + 5600, 1000, 1300, 3, 4)
