"""Copy a CUDA shared library keeping, in its embedded GPU code, only the machine code of one GPU architecture.

    python3 benchmarks/slim_fatbin.py SRC.so DST.so [ARCH]      # ARCH default 90: the H100 and H200

Why: onnxruntime-gpu's CUDA provider (`libonnxruntime_providers_cuda.so`, 272 MB) carries compiled kernels for six
architectures (sm_75 to sm_120) in its `.nv_fatbin` section; compressed it is 169 MiB, more than one device call can
carry (64 MiB). The H200 runs only the sm_90 ones (75 MB of it). Written here, not taken from a library: NVIDIA's
`nvprune` prunes object files and static libraries, not a linked shared object, and no Python package edits fatbins.

How: the section holds fatbin containers (magic 0xBA55ED50, a 16-byte header: magic, version, header size, payload
size), each a list of entries (kind 1 PTX, 2 ELF machine code; the architecture at byte 28 of an entry's header). In
every container with an ELF entry for ARCH, only those entries are kept, moved to the container's start; the rest of
the container is zeroed and its payload size shrunk. Container offsets and the section's size do not change, so the
library's pointers into the section stay valid; containers without an ARCH entry are left as they are.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

CONTAINER_MAGIC = 0xBA55ED50
ELF_ENTRY = 2


def section(path: str, name: str) -> tuple[int, int]:
    """(file offset, size) of an ELF section, read with binutils' readelf."""
    listing = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        if f" {name} " in line:
            fields = line.split("]")[1].split()  # name, type, address, offset, size, ...
            return int(fields[3], 16), int(fields[4], 16)
    raise SystemExit(f"{path} has no {name} section")


def entries(buf: bytearray, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(offset, length, kind, arch) of each entry of the container payload buf[start:end]."""
    found, pos = [], start
    while pos < end:
        kind, _version, header, payload = struct.unpack_from("<HHIQ", buf, pos)
        arch = struct.unpack_from("<I", buf, pos + 28)[0]
        found.append((pos, header + payload, kind, arch))
        pos += header + payload
    if pos != end:
        raise SystemExit(f"a container's entries end at {pos}, its payload at {end}: not a fatbin this script reads")
    return found


def slim(buf: bytearray, arch: int) -> tuple[int, int, int]:
    """Keep only `arch`'s machine code in each container that has some; (containers, bytes kept, bytes zeroed)."""
    containers = kept = zeroed = 0
    pos = 0
    while pos + 16 <= len(buf):
        magic, _version, header, payload = struct.unpack_from("<IHHQ", buf, pos)
        if magic != CONTAINER_MAGIC:
            pos += 8  # containers are 8-byte aligned, with padding between them
            continue
        containers += 1
        start, end = pos + header, pos + header + payload
        found = entries(buf, start, end)
        keep = [e for e in found if e[2] == ELF_ENTRY and e[3] == arch]
        if keep and len(keep) < len(found):
            data = b"".join(bytes(buf[offset : offset + length]) for offset, length, _, _ in keep)
            buf[start:end] = data + bytes(payload - len(data))
            struct.pack_into("<Q", buf, pos + 8, len(data))
            kept, zeroed = kept + len(data), zeroed + payload - len(data)
        pos = end
    return containers, kept, zeroed


def main(src: str, dst: str, arch: int = 90) -> None:
    offset, size = section(src, ".nv_fatbin")
    with open(src, "rb") as f:
        f.seek(offset)
        buf = bytearray(f.read(size))
    containers, kept, zeroed = slim(buf, arch)
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(buf)
    print(f"sm_{arch}: {containers} containers, {kept} bytes kept where others were dropped, {zeroed} zeroed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 90)
