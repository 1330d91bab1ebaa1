#!/usr/bin/env python3
"""Checks that PyTorch reads the safetensors files memgrad writes, and writes one back.

  read_safetensors.py MG_FILE [--write-back PT_FILE]

MG_FILE comes from `examples/safetensors_interop write MG_FILE`. Element i (flat, row-major) of
each tensor follows the formulas in examples/safetensors_interop.cc, computed here on their own:
floating (i % 17) * 0.25 - 2, i64 i * 1000003 - 500000000000, i32 i * 7919 - 100000,
u8 (i * 37) % 256, bool i % 3 == 0. Three readers check them: this file's own parser of the
documented format (struct, no torch), safetensors.torch.load_file when the package is installed,
and torch.frombuffer over the parsed offsets. --write-back saves the same tensors from PyTorch
(safetensors.torch.save_file, or this file's writer) for `safetensors_interop check PT_FILE`.
Prints one line per check and PASS/FAIL; exits 1 on any failure.
"""
import argparse
import json
import struct
import sys

SPECS = [  # name, safetensors dtype, shape: the same list as examples/safetensors_interop.cc
    ("f64", "F64", [3, 4]), ("f32", "F32", [2, 3, 4]), ("f16", "F16", [5]), ("bf16", "BF16", [2, 8]),
    ("i64", "I64", [6]), ("i32", "I32", [3, 3]), ("u8", "U8", [10]), ("bool", "BOOL", [7]),
    ("scalar", "F32", []), ("empty", "F32", [0, 4]), ("layers.0.weight", "F32", [4, 2]),
]
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1}
FORMATS = {"F64": "d", "F32": "f", "F16": "e", "I64": "q", "I32": "i", "U8": "B", "BOOL": "?"}


def expected(dtype, i):
    if dtype == "I64":
        return i * 1000003 - 500000000000
    if dtype == "I32":
        return i * 7919 - 100000
    if dtype == "U8":
        return (i * 37) % 256
    if dtype == "BOOL":
        return i % 3 == 0
    return (i % 17) * 0.25 - 2.0


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def parse(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return header, raw[8 + n:]


def check_pure(header, data):
    """The documented format, read with struct only."""
    problems = []
    meta = header.get("__metadata__", {})
    if meta.get("format") != "pt":
        problems.append(f"__metadata__.format is {meta.get('format')!r}, expected 'pt'")
    if "memgrad.meta" in meta:
        print("memgrad.meta:", json.loads(meta["memgrad.meta"]))
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items() if k != "__metadata__")
    at = 0
    for b, e, k in spans:
        if b != at:
            problems.append(f"{k}: data starts at {b}, expected {at}")
        at = e
    if at != len(data):
        problems.append(f"tensors cover {at} bytes, data section has {len(data)}")
    for name, dtype, shape in SPECS:
        info = header.get(name)
        if info is None:
            problems.append(f"{name}: missing")
            continue
        if info["dtype"] != dtype or info["shape"] != shape:
            problems.append(f"{name}: {info['dtype']} {info['shape']}, expected {dtype} {shape}")
            continue
        b, e = info["data_offsets"]
        n = numel(shape)
        if e - b != n * SIZES[dtype]:
            problems.append(f"{name}: {e - b} bytes for {n} x {dtype}")
            continue
        chunk = data[b:e]
        if dtype == "BF16":
            values = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack(f"<{n}H", chunk)]
        else:
            values = list(struct.unpack(f"<{n}{FORMATS[dtype]}", chunk))
        wrong = sum(1 for i, v in enumerate(values) if v != expected(dtype, i))
        print(f"  struct      {name:16s} {dtype:5s} {str(shape):10s} {'ok' if not wrong else f'{wrong} WRONG'}")
        if wrong:
            problems.append(f"{name}: {wrong} wrong values")
    return problems


def torch_expected(torch, dtype, shape):
    tdt = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}[dtype]
    i = torch.arange(numel(shape), dtype=torch.int64)
    if dtype == "I64":
        v = i * 1000003 - 500000000000
    elif dtype == "I32":
        v = i * 7919 - 100000
    elif dtype == "U8":
        v = (i * 37) % 256
    elif dtype == "BOOL":
        v = i % 3 == 0
    else:
        v = (i % 17).to(torch.float64) * 0.25 - 2.0
    return v.to(tdt).reshape(shape)


def check_torch(torch, tensors, how):
    problems = []
    for name, dtype, shape in SPECS:
        t = tensors.get(name)
        want = torch_expected(torch, dtype, shape)
        ok = t is not None and t.dtype == want.dtype and list(t.shape) == shape and torch.equal(t, want)
        print(f"  {how:11s} {name:16s} {dtype:5s} {str(shape):10s} {'ok' if ok else 'WRONG'}")
        if not ok:
            problems.append(f"{how}: {name} differs")
    return problems


def frombuffer_load(torch, header, data):
    dts = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}
    out = {}
    buf = bytearray(data)
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        n = numel(v["shape"])
        t = torch.frombuffer(buf, dtype=dts[v["dtype"]], count=n, offset=b) if n else torch.empty(0, dtype=dts[v["dtype"]])
        out[k] = t.reshape(v["shape"]).clone()
    return out


def write_back(torch, path):
    tensors = {name: torch_expected(torch, dtype, shape).contiguous() for name, dtype, shape in SPECS}
    meta = {"format": "pt", "writer": "pytorch"}
    try:
        from safetensors.torch import save_file
        save_file(tensors, path, metadata=meta)
        return "safetensors.torch.save_file"
    except ImportError:
        pass
    names = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}
    header, blobs, at = {"__metadata__": meta}, [], 0
    for k, t in tensors.items():
        blob = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[k] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return "this script's writer"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mg_file")
    ap.add_argument("--write-back", metavar="PT_FILE")
    args = ap.parse_args()
    header, data = parse(args.mg_file)
    problems = check_pure(header, data)
    try:
        import torch
    except ImportError:
        torch = None
        print("torch not importable: checked with struct only")
    if torch is not None:
        print("torch", torch.__version__)
        try:
            from safetensors.torch import load_file
            import safetensors
            print("safetensors", safetensors.__version__)
            problems += check_torch(torch, load_file(args.mg_file), "load_file")
        except ImportError:
            print("safetensors not importable: torch.frombuffer over the documented layout only")
        problems += check_torch(torch, frombuffer_load(torch, header, data), "frombuffer")
        if args.write_back:
            print(f"wrote {args.write_back} with {write_back(torch, args.write_back)}")
    for p in problems:
        print("PROBLEM:", p)
    print("PASS" if not problems else "FAIL")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
