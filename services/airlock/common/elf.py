"""The few facts of an ELF file a root job's trust depends on: PT_INTERP, RUNPATH and RPATH.

The dynamic loader named by ``PT_INTERP`` runs before the program, and the
directories in ``DT_RUNPATH``/``DT_RPATH`` are searched for its libraries
before the system's: whoever can change one of them runs code as the job.
`read_elf` reads just enough of the headers to name them (docs/security.md,
"What is bound to a ticket"); common/interp.py walks what it finds.

Pure: no I/O.  The caller passes ``read(offset, size) -> bytes`` (short at
the end of the file); anything malformed is an `ElfError`, never another
exception.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

MAGIC = b"\x7fELF"
_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NULL, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 5, 15, 29
_MAX_PHDRS = 4096
_MAX_DYNAMIC = 1 << 16  # entries
_MAX_STRING = 4096  # a path list longer than this is not one a loader takes

Reader = Callable[[int, int], bytes]


class ElfError(ValueError):
    """An ELF file whose headers cannot be read; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class ElfInfo:
    interp: str | None  # PT_INTERP: the dynamic loader
    runpath: tuple[str, ...]  # DT_RUNPATH entries, in order (":"-separated in the file)
    rpath: tuple[str, ...]  # DT_RPATH entries


def _exact(read: Reader, offset: int, size: int, what: str) -> bytes:
    data = read(offset, size)
    if len(data) != size:
        raise ElfError(f"truncated {what}")
    return data


def read_elf(read: Reader) -> ElfInfo | None:
    """The loader and library directories of an ELF file; None if it is not ELF at all."""
    ident = read(0, 16)
    if ident[:4] != MAGIC:
        return None
    if len(ident) < 16:
        raise ElfError("truncated ELF identification")
    klass, data_encoding = ident[4], ident[5]
    if klass not in (1, 2) or data_encoding not in (1, 2):
        raise ElfError("unknown ELF class or byte order")
    wide = klass == 2
    end = "<" if data_encoding == 1 else ">"
    loads, interp, dynamic = _segments(read, wide, end)
    if dynamic is None:
        return ElfInfo(interp, (), ())
    runpath, rpath = _search_paths(read, wide, end, loads, dynamic)
    return ElfInfo(interp, runpath, rpath)


def _segments(
    read: Reader, wide: bool, end: str
) -> tuple[list[tuple[int, int, int]], str | None, tuple[int, int] | None]:
    """PT_LOAD segments (vaddr, offset, filesz), the PT_INTERP text, and PT_DYNAMIC (offset, size)."""
    header = _exact(read, 0, 64 if wide else 52, "ELF header")
    phoff = struct.unpack_from(end + ("Q" if wide else "I"), header, 32 if wide else 28)[0]
    phentsize, phnum = struct.unpack_from(end + "HH", header, 54 if wide else 42)
    loads: list[tuple[int, int, int]] = []
    interp: str | None = None
    dynamic: tuple[int, int] | None = None
    if phnum == 0:
        return loads, interp, dynamic
    if phentsize < (56 if wide else 32) or phnum > _MAX_PHDRS:
        raise ElfError("bad program header table")
    table = _exact(read, phoff, phentsize * phnum, "program headers")
    for index in range(phnum):
        at = index * phentsize
        if wide:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(end + "IIQQQQ", table, at)
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(end + "IIIII", table, at)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_INTERP:
            if p_filesz == 0 or p_filesz > _MAX_STRING:
                raise ElfError("bad PT_INTERP")
            interp = _text(_exact(read, p_offset, p_filesz, "PT_INTERP").split(b"\0", 1)[0], "PT_INTERP")
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    return loads, interp, dynamic


def _search_paths(
    read: Reader, wide: bool, end: str, loads: list[tuple[int, int, int]], dynamic: tuple[int, int]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """DT_RUNPATH and DT_RPATH, each split at ``:``."""
    entry = 16 if wide else 8
    count = min(dynamic[1] // entry, _MAX_DYNAMIC)
    table = _exact(read, dynamic[0], count * entry, "dynamic section")
    strtab: int | None = None
    wanted: list[tuple[int, int]] = []  # (tag, string offset)
    for index in range(count):
        tag, value = struct.unpack_from(end + ("qQ" if wide else "iI"), table, index * entry)
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = value
        elif tag in (_DT_RUNPATH, _DT_RPATH):
            wanted.append((tag, value))
    if not wanted:
        return (), ()
    if strtab is None:
        raise ElfError("RUNPATH or RPATH without a string table")
    base = _file_offset(loads, strtab)
    found: dict[int, tuple[str, ...]] = {}
    for tag, offset in wanted:
        raw = read(base + offset, _MAX_STRING + 1)
        if b"\0" not in raw:
            raise ElfError("RUNPATH or RPATH string is not terminated")
        text = _text(raw.split(b"\0", 1)[0], "RUNPATH")
        found[tag] = found.get(tag, ()) + tuple(text.split(":"))
    return found.get(_DT_RUNPATH, ()), found.get(_DT_RPATH, ())


def _file_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int:
    for start, offset, size in loads:
        if start <= vaddr < start + size:
            return offset + (vaddr - start)
    raise ElfError("the string table is in no loaded segment")


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8", "surrogateescape")
    except UnicodeDecodeError:  # pragma: no cover - surrogateescape decodes every byte
        raise ElfError(f"{what} is not text") from None
