#!/usr/bin/env python3
"""Minimal GGUF v3 writer (and reader for self-checks), standard library only.

Used by make_reference.py to export the tiny reference model in llama.cpp's conventions, so it must
not depend on numpy or the `gguf` pip package (neither exists on the device image). Layout: see
shared/spec/model.md §9.1 (header, metadata, tensor infos, padding, aligned data section).

Self-check (runs anywhere):  python3 gguf_writer.py --selftest OUT.gguf
writes a file exercising every metadata type and the F32 / F16 / Q8_0 tensor types, re-reads it
with read_gguf() below and compares. The C++ test `reference_pywriter_test` reads the same file with
ds::gguf::File and checks the values listed in SELFTEST_* (keep both sides in sync).
"""
import math
import struct
import sys
from array import array

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3

# Metadata value types (§9.1).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
               BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
_INT_RANGE = {U8: (0, 2**8 - 1), I8: (-2**7, 2**7 - 1), U16: (0, 2**16 - 1),
              I16: (-2**15, 2**15 - 1), U32: (0, 2**32 - 1), I32: (-2**31, 2**31 - 1),
              U64: (0, 2**64 - 1), I64: (-2**63, 2**63 - 1)}

# ggml tensor types this writer can size: id -> (name, elements per block, bytes per block).
GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q6_K, GGML_BF16 = 0, 1, 8, 14, 30
GGML_TYPES = {GGML_F32: ("F32", 1, 4), GGML_F16: ("F16", 1, 2), GGML_Q8_0: ("Q8_0", 32, 34),
              GGML_Q6_K: ("Q6_K", 256, 210), GGML_BF16: ("BF16", 1, 2)}


def _pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value):
    if vtype == STRING:
        if not isinstance(value, str):
            raise TypeError("string value expected, got %r" % (value,))
        return _pack_string(value)
    if vtype == ARRAY:
        elem_type, items = value
        out = [struct.pack("<IQ", elem_type, len(items))]
        out += [_pack_value(elem_type, it) for it in items]
        return b"".join(out)
    if vtype not in _SCALAR_FMT:
        raise ValueError("unknown GGUF value type %d" % vtype)
    if vtype == BOOL:
        if not isinstance(value, bool):
            raise TypeError("bool value expected, got %r" % (value,))
    elif vtype in _INT_RANGE:
        lo, hi = _INT_RANGE[vtype]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError("integer %r does not fit GGUF type %d" % (value, vtype))
    elif vtype == F32:
        value = float(value)
        if math.isfinite(value) and abs(value) > 3.4028234663852886e38:
            raise ValueError("%r overflows f32" % value)
    return struct.pack(_SCALAR_FMT[vtype], value)


class GGUFWriter:
    """Collects metadata and tensors, then writes one GGUF v3 file.

    Metadata keep insertion order. Tensor data are raw little-endian bytes in ggml layout; shapes are
    given in ggml order (ne0 first = contiguous dimension), i.e. a PyTorch [out, in] matrix is
    ne = [in, out].
    """

    def __init__(self, alignment=32):
        if alignment <= 0 or alignment % 8:
            raise ValueError("alignment must be a positive multiple of 8")
        self.alignment = alignment
        self._kv = []          # (key, packed type+value bytes)
        self._keys = set()
        self._tensors = []     # (name, ne, ggml_type, data bytes)
        self._tensor_names = set()
        if alignment != 32:
            self.add_u32("general.alignment", alignment)

    # ---- metadata -------------------------------------------------------------------------------
    def add(self, key, vtype, value):
        if key in self._keys:
            raise ValueError("duplicate metadata key %s" % key)
        self._keys.add(key)
        self._kv.append((key, struct.pack("<I", vtype) + _pack_value(vtype, value)))

    def add_u8(self, k, v): self.add(k, U8, v)
    def add_i8(self, k, v): self.add(k, I8, v)
    def add_u16(self, k, v): self.add(k, U16, v)
    def add_i16(self, k, v): self.add(k, I16, v)
    def add_u32(self, k, v): self.add(k, U32, v)
    def add_i32(self, k, v): self.add(k, I32, v)
    def add_f32(self, k, v): self.add(k, F32, v)
    def add_bool(self, k, v): self.add(k, BOOL, v)
    def add_string(self, k, v): self.add(k, STRING, v)
    def add_u64(self, k, v): self.add(k, U64, v)
    def add_i64(self, k, v): self.add(k, I64, v)
    def add_f64(self, k, v): self.add(k, F64, v)

    def add_array(self, key, elem_type, items):
        """items: list of values of elem_type; for nested arrays elem_type=ARRAY and each item is
        an (inner_elem_type, inner_items) pair."""
        self.add(key, ARRAY, (elem_type, list(items)))

    # ---- tensors --------------------------------------------------------------------------------
    def add_tensor(self, name, ne, ggml_type, data):
        """Raw tensor: `data` (bytes-like) must hold exactly the ggml byte size of the shape."""
        if name in self._tensor_names:
            raise ValueError("duplicate tensor %s" % name)
        if len(name.encode("utf-8")) > 64:
            raise ValueError("tensor name longer than 64 bytes: %s" % name)
        ne = [int(n) for n in ne]
        if not 1 <= len(ne) <= 4 or any(n <= 0 for n in ne):
            raise ValueError("tensor %s: bad shape %r" % (name, ne))
        if ggml_type not in GGML_TYPES:
            raise ValueError("tensor %s: unsupported ggml type %d" % (name, ggml_type))
        _, block_elems, block_bytes = GGML_TYPES[ggml_type]
        if ne[0] % block_elems:
            raise ValueError("tensor %s: ne0=%d not a multiple of the block size %d"
                             % (name, ne[0], block_elems))
        rows = 1
        for n in ne[1:]:
            rows *= n
        nbytes = ne[0] // block_elems * block_bytes * rows
        data = bytes(data)
        if len(data) != nbytes:
            raise ValueError("tensor %s: %d data bytes, shape %r of type %d needs %d"
                             % (name, len(data), ne, ggml_type, nbytes))
        self._tensor_names.add(name)
        self._tensors.append((name, ne, ggml_type, data))

    def add_tensor_f32(self, name, ne, values):
        """values: flat sequence of floats in ggml order (ne0 fastest), or an array('f')."""
        if isinstance(values, array) and values.typecode == "f":
            a = values
        else:
            a = array("f", values)
        if sys.byteorder != "little":
            a = array("f", a)
            a.byteswap()
        self.add_tensor(name, ne, GGML_F32, a.tobytes())

    # ---- output ---------------------------------------------------------------------------------
    def _pad(self, n):
        return (-n) % self.alignment

    def to_bytes(self):
        out = bytearray()
        out += GGUF_MAGIC
        out += struct.pack("<IQQ", GGUF_VERSION, len(self._tensors), len(self._kv))
        for key, packed in self._kv:
            out += _pack_string(key)
            out += packed
        offset = 0
        offsets = []
        for name, ne, ggml_type, data in self._tensors:
            offsets.append(offset)
            out += _pack_string(name)
            out += struct.pack("<I", len(ne))
            out += struct.pack("<%dQ" % len(ne), *ne)
            out += struct.pack("<IQ", ggml_type, offset)
            offset += len(data) + self._pad(len(data))
        out += b"\0" * self._pad(len(out))
        for (name, ne, ggml_type, data), off in zip(self._tensors, offsets):
            out += data
            out += b"\0" * self._pad(len(data))
        return bytes(out)

    def write(self, path):
        data = self.to_bytes()
        with open(path, "wb") as f:
            f.write(data)
        return len(data)


# ---- reader (self-checks only) -------------------------------------------------------------------
class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("<Q")
        s = self.buf[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(_SCALAR_FMT[vtype])


def read_gguf(buf):
    """Parses a GGUF image. Returns (metadata {key: (type, value)}, tensors {name: (ne, type,
    data bytes)}); arrays are (elem_type, [items])."""
    c = _Cursor(buf)
    if buf[:4] != GGUF_MAGIC:
        raise ValueError("bad magic")
    c.pos = 4
    version, n_tensors, n_kv = c.take("<I"), c.take("<Q"), c.take("<Q")
    if version != GGUF_VERSION:
        raise ValueError("version %d" % version)
    meta = {}
    for _ in range(n_kv):
        key = c.string()
        vt = c.take("<I")
        meta[key] = (vt, c.value(vt))
    align = meta.get("general.alignment", (U32, 32))[1]
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        nd = c.take("<I")
        ne = [c.take("<Q") for _ in range(nd)]
        tt, off = c.take("<I"), c.take("<Q")
        infos.append((name, ne, tt, off))
    data_start = c.pos + (-c.pos) % align
    tensors = {}
    for name, ne, tt, off in infos:
        if off % align:
            raise ValueError("tensor %s offset %d not aligned" % (name, off))
        _, be, bb = GGML_TYPES[tt]
        rows = 1
        for n in ne[1:]:
            rows *= n
        nbytes = ne[0] // be * bb * rows
        start = data_start + off
        if start + nbytes > len(buf):
            raise ValueError("tensor %s out of range" % name)
        tensors[name] = (ne, tt, buf[start:start + nbytes])
    return meta, tensors


def pack_q8_0(scales_f16_bits, quants):
    """Q8_0 blocks from per-block fp16 scale bit patterns (uint16) and int8 quants (32 per block)."""
    if len(quants) != 32 * len(scales_f16_bits):
        raise ValueError("Q8_0 needs 32 quants per scale")
    out = bytearray()
    for b, d in enumerate(scales_f16_bits):
        out += struct.pack("<H32b", d, *quants[32 * b:32 * b + 32])
    return bytes(out)


# ---- self-test content (mirrored in reference_pywriter_test.cc) ----------------------------------
SELFTEST_F32_NE = [5, 3]          # values: 0.25 * i - 1.0, i = 0..14
SELFTEST_F16_NE = [4, 2]          # values: 0.5 * i - 2.0 (exact in f16)
SELFTEST_Q8_NE = [64, 2]          # 4 blocks, scale 2^-(b+1), quants (7 * j + 3 * b) % 255 - 127


def selftest_writer():
    w = GGUFWriter(alignment=64)  # non-default: exercises general.alignment and padding
    w.add_string("general.architecture", "pytest")
    w.add_u8("test.u8", 200)
    w.add_i8("test.i8", -100)
    w.add_u16("test.u16", 60000)
    w.add_i16("test.i16", -30000)
    w.add_u32("test.u32", 4000000000)
    w.add_i32("test.i32", -2000000000)
    w.add_f32("test.f32", 1.5e-6)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "héllo ✓")
    w.add_u64("test.u64", 2**63 + 5)
    w.add_i64("test.i64", -(2**62) - 7)
    w.add_f64("test.f64", -2.5e300)
    w.add_array("test.arr_i32", I32, [3, 3, 2, 0, -7])
    w.add_array("test.arr_f32", F32, [0.5, -1.25, 3.0])
    w.add_array("test.arr_str", STRING, ["a", "", "c d"])
    w.add_array("test.arr_u8", U8, [1, 2, 255])
    w.add_array("test.arr_nested", ARRAY, [(I32, [1, 2]), (I32, [3])])
    w.add_tensor_f32("t.f32", SELFTEST_F32_NE, [0.25 * i - 1.0 for i in range(15)])
    w.add_tensor("t.f16", SELFTEST_F16_NE, GGML_F16,
                 struct.pack("<8e", *[0.5 * i - 2.0 for i in range(8)]))
    scales = [struct.unpack("<H", struct.pack("<e", 2.0 ** -(b + 1)))[0] for b in range(4)]
    quants = [(7 * j + 3 * b) % 255 - 127 for b in range(4) for j in range(32)]
    w.add_tensor("t.q8_0", SELFTEST_Q8_NE, GGML_Q8_0, pack_q8_0(scales, quants))
    return w


def selftest(path):
    w = selftest_writer()
    w.write(path)
    with open(path, "rb") as f:
        buf = f.read()
    meta, tensors = read_gguf(buf)
    expect = {"test.u8": 200, "test.i8": -100, "test.u16": 60000, "test.i16": -30000,
              "test.u32": 4000000000, "test.i32": -2000000000, "test.bool_true": True,
              "test.bool_false": False, "test.string": "héllo ✓", "test.u64": 2**63 + 5,
              "test.i64": -(2**62) - 7, "test.f64": -2.5e300, "general.alignment": 64}
    for k, v in expect.items():
        assert meta[k][1] == v, (k, meta[k], v)
    assert abs(meta["test.f32"][1] - 1.5e-6) < 1e-12
    assert meta["test.arr_i32"] == (ARRAY, (I32, [3, 3, 2, 0, -7]))
    assert meta["test.arr_nested"][1] == (ARRAY, [(I32, [1, 2]), (I32, [3])])
    assert meta["test.arr_str"][1] == (STRING, ["a", "", "c d"])
    ne, tt, data = tensors["t.f32"]
    assert ne == SELFTEST_F32_NE and tt == GGML_F32
    assert list(struct.unpack("<15f", data)) == [0.25 * i - 1.0 for i in range(15)]
    ne, tt, data = tensors["t.f16"]
    assert list(struct.unpack("<8e", data)) == [0.5 * i - 2.0 for i in range(8)]
    ne, tt, data = tensors["t.q8_0"]
    assert tt == GGML_Q8_0 and len(data) == 4 * 34
    d2, = struct.unpack_from("<e", data, 2 * 34)
    q = struct.unpack_from("<32b", data, 2 * 34 + 2)
    assert d2 == 0.125 and q[1] == (7 + 6) % 255 - 127
    print("gguf_writer selftest OK: %s (%d bytes, %d keys, %d tensors)"
          % (path, len(buf), len(meta), len(tensors)))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--selftest":
        selftest(sys.argv[2])
    else:
        sys.exit("usage: gguf_writer.py --selftest OUT.gguf")
