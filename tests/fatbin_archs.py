#!/usr/bin/env python3
"""List the CUDA architectures embedded in an ELF file's .nv_fatbin section.

Used by tests/gpu_arch_check.sh where cuobjdump is not installed. Written by
hand because Debian ships no library that reads fat binaries; the layout is
the one nvcc's fatbinary tool writes:

  fat binary header (16 bytes): u32 magic 0xBA55ED50, u16 version,
      u16 header size, u64 size of the entries that follow;
  entry header: u16 kind (1 = PTX, 2 = ELF machine code), u16 version,
      u32 header size, u64 padded payload size, ..., u32 arch at offset 28
      (80 = sm_80 / compute_80).

A section holds one fat binary per translation unit, each 8-byte aligned.
Prints one line per distinct (kind, arch): "sm_80" for machine code,
"compute_90" for PTX. Exit 2 when the file has no .nv_fatbin section.
"""
import struct
import subprocess
import sys
import tempfile

MAGIC = 0xBA55ED50


def section_bytes(path):
    with tempfile.NamedTemporaryFile() as tmp:
        r = subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", path,
                            tmp.name], capture_output=True)
        if r.returncode != 0:
            return b""
        with open(tmp.name, "rb") as f:
            return f.read()


def archs(data):
    found = set()
    off = 0
    while off + 16 <= len(data):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", data, off)
        if magic != MAGIC:
            off += 8  # padding between fat binaries
            continue
        e = off + hsize
        end = off + hsize + fsize
        while e + 32 <= end:
            kind, _ev, ehsize, payload = struct.unpack_from("<HHIQ", data, e)
            arch = struct.unpack_from("<I", data, e + 28)[0]
            if kind == 1:
                found.add("compute_%d" % arch)
            elif kind == 2:
                found.add("sm_%d" % arch)
            if ehsize == 0:
                break
            e += ehsize + payload
        off = (end + 7) & ~7
    return found


def main():
    if len(sys.argv) != 2:
        print("usage: fatbin_archs.py ELF", file=sys.stderr)
        return 64
    data = section_bytes(sys.argv[1])
    if not data:
        print("%s: no .nv_fatbin section" % sys.argv[1], file=sys.stderr)
        return 2
    for a in sorted(archs(data)):
        print(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
