"""Memory sizes as flags spell them, the host's available memory and the process's resident
set (baton.core.kv_cache.host_memory)."""

from __future__ import annotations

import pytest

from baton.core.kv_cache.host_memory import (
    available_memory_bytes,
    format_size,
    parse_memory_size,
    release_freed_heap,
    resident_set,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 * 2**20),
        ("2GiB", 2 * 2**30),
        ("2gib", 2 * 2**30),
        ("4GB", 4 * 10**9),
        ("1.5G", 3 * 2**29),
        ("64 KiB", 64 * 1024),
        ("1048576", 2**20),
        ("100b", 100),
    ],
)
def test_sizes_read_as_bytes_decimal_or_binary(text: str, expected: int) -> None:
    assert parse_memory_size(text, "--kv-cache-memory") == expected


@pytest.mark.parametrize("text", ["lots", "2 parsecs", "-1GiB", "", "1e9", "GiB"])
def test_a_size_that_is_not_one_is_refused_with_examples(text: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_memory_size(text, "--kv-cache-memory")

    assert str(refused.value).startswith(
        "--kv-cache-memory must be a byte count or a size with a unit such as 512MiB, 2GiB or "
        "4GB (units: b, kb, mb, gb, tb, k, m, g, t, kib, mib, gib, tib, case-insensitive), "
        f"got {text!r}"
    )


def test_a_zero_size_is_refused() -> None:
    with pytest.raises(ValueError, match="--kv-cache-memory must be more than zero bytes"):
        parse_memory_size("0MiB", "--kv-cache-memory")


def test_sizes_print_in_the_largest_unit_they_fill() -> None:
    assert [format_size(n) for n in (40 * 1024, 300 * 2**20, 3 * 2**29)] == [
        "40 KiB",
        "300 MiB",
        "1.50 GiB",
    ]


def test_resident_set_grows_with_touched_memory_and_peak_stays_above() -> None:
    before = resident_set()
    block = bytearray(64 * 2**20)  # zero-filled: every page is touched
    after = resident_set()

    assert before.current is not None and after.current is not None
    assert after.current - before.current >= 60 * 2**20
    assert after.peak >= after.current
    assert after.describe().startswith("RSS ") and "(peak " in after.describe()
    del block


def test_available_memory_is_some_but_not_more_than_the_machine_has() -> None:
    available = available_memory_bytes()

    assert available is not None
    assert 0 < available <= _mem_total()


def _mem_total() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def test_freed_heap_pages_go_back_to_the_system():
    import torch

    # A freed 16 MiB block raises glibc's mmap threshold past it, so the 1 MiB blocks after it
    # come from the heap; the last one kept pins the heap's top, so what is freed lies inside.
    big = torch.ones(4 * 1024 * 1024)
    del big
    blocks = [torch.ones(256 * 1024) for _ in range(120)]
    last = blocks.pop()
    del blocks
    before = resident_set().current

    assert release_freed_heap()

    after = resident_set().current
    assert before is not None and after is not None
    assert before - after > 64 * 2**20
    assert last.sum() == 256 * 1024
