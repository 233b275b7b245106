#!/usr/bin/env python3
"""Reads the F32 / F16 tensors and the scalar metadata of a GGUF file (ggml docs/gguf.md, version 3)
for tools/train/distill_mtp.py, which starts from the committed demo model. The parser needs only
the standard library (it runs here, without torch); `as_torch` converts a tensor on the device.

Only what the demo file holds is supported: tensor types F32 (0) and F16 (1); quantized tensors
raise. Shapes come back in torch order (the reverse of GGUF's ne0-first dims)."""
import struct

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_TYPE_BYTES = {0: 4, 1: 2}  # ggml F32, F16


class _Reader:
    def __init__(self, buf):
        self.buf, self.off = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.off)[0]
        self.off += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.buf[self.off:self.off + n].decode("utf-8")
        self.off += n
        return s

    def value(self, t):
        if t in _SCALAR:
            return self.take(_SCALAR[t])
        if t == _STRING:
            return self.string()
        if t == _ARRAY:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"GGUF: unknown metadata type {t}")


def read_gguf(path):
    """Returns (metadata dict, {tensor name: (torch-order shape, ggml type, raw little-endian bytes)})."""
    with open(path, "rb") as f:
        buf = f.read()
    r = _Reader(buf)
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.off = 4
    version = r.take("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, dims, r.take("<I"), r.take("<Q")))
    align = int(meta.get("general.alignment", 32))
    base = (r.off + align - 1) // align * align
    tensors = {}
    for name, dims, gtype, offset in infos:
        if gtype not in _TYPE_BYTES:
            raise ValueError(f"{path}: tensor {name} has ggml type {gtype} (only F32 / F16 read)")
        n = 1
        for d in dims:
            n *= d
        start = base + offset
        if start + n * _TYPE_BYTES[gtype] > len(buf):
            raise ValueError(f"{path}: tensor {name} runs past the end of the file")
        tensors[name] = (list(reversed(dims)), gtype, buf[start:start + n * _TYPE_BYTES[gtype]])
    return meta, tensors


def as_torch(entry):
    """One read_gguf tensor as a float32 torch tensor."""
    import torch
    shape, gtype, raw = entry
    dtype = torch.float32 if gtype == 0 else torch.float16
    return torch.frombuffer(bytearray(raw), dtype=dtype).float().reshape(shape)
