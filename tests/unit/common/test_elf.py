"""common/elf.py: PT_INTERP and RUNPATH/RPATH from ELF headers, built by hand and read from real files."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airlock.common.elf import ElfError, ElfInfo, read_elf


def _reader(data: bytes) -> Callable[[int, int], bytes]:
    return lambda offset, size: data[offset : offset + size]


def build(
    *,
    interp: bytes | None = b"/lib/ld.so",
    runpath: bytes | None = None,
    rpath: bytes | None = None,
    wide: bool = True,
    little: bool = True,
) -> bytes:
    """A minimal ELF: header, program headers (LOAD over the whole file, INTERP, DYNAMIC), strings."""
    e = "<" if little else ">"
    ehsize, phentsize = (64, 56) if wide else (52, 32)
    strings = b"\0" + (runpath + b"\0" if runpath else b"") + (rpath + b"\0" if rpath else b"")
    dyn: list[tuple[int, int]] = [(5, 0)]  # DT_STRTAB: vaddr filled below
    if runpath:
        dyn.append((29, 1))
    if rpath:
        dyn.append((15, 1 + (len(runpath) + 1 if runpath else 0)))
    dyn.append((0, 0))
    phnum = 3 if interp is not None else 2
    phoff = ehsize
    interp_off = phoff + phnum * phentsize
    interp_bytes = (interp + b"\0") if interp is not None else b""
    dyn_off = interp_off + len(interp_bytes)
    entsize = 16 if wide else 8
    str_off = dyn_off + len(dyn) * entsize
    vbase = 0x400000
    dyn = [(tag, vbase + str_off if tag == 5 else value) for tag, value in dyn]
    total = str_off + len(strings)
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if little else 2, 1]) + b"\0" * 9
    if wide:
        header = ident + struct.pack(e + "HHIQQQIHHHHHH", 2, 62, 1, 0, phoff, 0, 0, ehsize, phentsize, phnum, 0, 0, 0)
    else:
        header = ident + struct.pack(e + "HHIIIIIHHHHHH", 2, 3, 1, 0, phoff, 0, 0, ehsize, phentsize, phnum, 0, 0, 0)

    def ph(p_type: int, offset: int, size: int) -> bytes:
        if wide:
            return struct.pack(e + "IIQQQQQQ", p_type, 4, offset, vbase + offset, 0, size, size, 8)
        return struct.pack(e + "IIIIIIII", p_type, offset, vbase + offset, 0, size, size, 4, 4)

    phdrs = ph(1, 0, total)
    if interp is not None:
        phdrs += ph(3, interp_off, len(interp_bytes))
    phdrs += ph(2, dyn_off, len(dyn) * entsize)
    body = b"".join(struct.pack(e + ("qQ" if wide else "iI"), t, v) for t, v in dyn)
    data = header + phdrs + interp_bytes + body + strings
    assert len(data) == total
    return data


def test_interp_runpath_and_rpath_are_read() -> None:
    info = read_elf(_reader(build(runpath=b"/opt/a/lib:$ORIGIN/../lib", rpath=b"/opt/b")))
    assert info == ElfInfo("/lib/ld.so", ("/opt/a/lib", "$ORIGIN/../lib"), ("/opt/b",))


@pytest.mark.parametrize(("wide", "little"), [(True, True), (True, False), (False, True), (False, False)])
def test_every_class_and_byte_order(wide: bool, little: bool) -> None:
    info = read_elf(_reader(build(runpath=b"/x", wide=wide, little=little)))
    assert info == ElfInfo("/lib/ld.so", ("/x",), ())


def test_a_static_binary_has_no_loader_and_no_paths() -> None:
    assert read_elf(_reader(build(interp=None))) == ElfInfo(None, (), ())


def test_not_elf_is_none() -> None:
    assert read_elf(_reader(b"#!/bin/sh\n")) is None
    assert read_elf(_reader(b"")) is None


def test_truncated_headers_are_an_error() -> None:
    data = build(runpath=b"/x")
    for cut in (10, 40, 70, 200):
        with pytest.raises(ElfError):
            read_elf(_reader(data[:cut]))


def test_real_binary() -> None:
    with open("/usr/bin/true", "rb") as f:
        data = f.read()
    info = read_elf(_reader(data))
    assert info is not None and info.interp is not None and info.interp.startswith("/")


@given(st.binary(max_size=512))
def test_arbitrary_bytes_give_info_none_or_elf_error(tail: bytes) -> None:
    for data in (b"\x7fELF" + tail, build(runpath=b"/x")[: len(tail)] + tail):
        try:
            read_elf(_reader(data))
        except ElfError:
            pass
