#!/usr/bin/env python3
"""Keeps only one GPU architecture's device code in a shared library's CUDA fat binaries.

ONNX Runtime's CUDA execution provider (libonnxruntime_providers_cuda.so, 230 MB) carries each
kernel as a cubin for sm_75, 80, 86, 89, 90 and 120; the GPU machine is an H100 (sm_90). CUDA
13's nvprune works on object files and static libraries only, so this walks the library's
.nv_fatbin section itself: each fat binary container (magic 0xBA55ED50, a 16-byte header, then
entries each with its own header: kind, header size, payload size, ..., the SM number at
offset 28) keeps its entries for the wanted architecture and gets the payloads of the others
zeroed in place. The file keeps its size and layout (every address the host code holds stays
right), the driver still finds the sm_90 cubin it picks for the device, and the zeroed bytes
compress to almost nothing (scripts/gpu_bundle.sh compresses the result with xz).

A container without an entry for the wanted architecture is left whole (its kernels may still
run from PTX or not be needed), and so is PTX (kind 1) of an architecture at or below the
wanted one, which the driver could compile for the device.

  fatbin_keep_arch.py <in.so> <out.so> [sm, default 90]
prints what it kept and zeroed; exits 1 when the library has no .nv_fatbin section or the walk
finds no container (then nothing is written).
"""

import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX = 1


def section(data, name):
    """(file offset, size) of ELF64 section `name`, or None."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    str_off, = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        h = shoff + i * shentsize
        name_off, = struct.unpack_from("<I", data, h)
        end = data.index(b"\0", str_off + name_off)
        if data[str_off + name_off:end].decode() == name:
            off, size = struct.unpack_from("<QQ", data, h + 0x18)
            return off, size
    return None


def main():
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    want = int(sys.argv[3]) if len(sys.argv) == 4 else 90
    data = bytearray(open(src, "rb").read())
    found = section(data, ".nv_fatbin")
    if found is None:
        print(f"{src}: no .nv_fatbin section", file=sys.stderr)
        return 1
    start, size = found
    pos, end = start, start + size
    containers = kept = zeroed = whole = 0
    while pos + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; padding between them
            continue
        containers += 1
        entries = []
        p, stop = pos + header_size, pos + header_size + fat_size
        while p < stop:
            kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", data, p)
            arch, = struct.unpack_from("<I", data, p + 28)
            entries.append((p + entry_header, payload, kind, arch))
            p += entry_header + payload
        if any(arch == want and kind != KIND_PTX for _, _, kind, arch in entries):
            for body, payload, kind, arch in entries:
                if arch == want or (kind == KIND_PTX and arch <= want):
                    kept += payload
                else:
                    data[body:body + payload] = bytes(payload)
                    zeroed += payload
        else:
            whole += 1
            kept += sum(e[1] for e in entries)
        pos = stop
    if containers == 0:
        print(f"{src}: no fat binary container in .nv_fatbin", file=sys.stderr)
        return 1
    open(dst, "wb").write(data)
    print(f"{containers} fat binaries: kept {kept / 1e6:.1f} MB (sm_{want}; {whole} without "
          f"sm_{want} left whole), zeroed {zeroed / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
