"""dscpp's indexed dataset against Megatron's format, read and written independently with numpy.

1. The CLI writes documents in each token dtype; numpy reads the header (magic, version 1, dtype
   code, counts), the three index arrays and the tokens back, and the files are byte-identical
   to what the numpy writer makes of the same documents.
2. numpy writes documents; the CLI reads every field and token back.
3. Corrupt or truncated files, and tokens outside their dtype, give an error naming the file
   and a non-zero exit, and a refused write leaves no file behind.
Last line: "N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_format as mf  # noqa: E402

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


RANGES = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-32768, 32767),
          "uint16": (0, 65535), "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def random_documents(rng, dtype):
    lo, hi = RANGES[dtype]
    docs = [[[lo, hi, 0 if lo == 0 else -1]]]  # the extremes of the dtype
    docs.append([])  # a document with no sequence, as Megatron writes an empty text
    for _ in range(40):
        nseq = rng.choice([1, 1, 1, 2, 3])
        docs.append([[rng.randint(lo, hi) for _ in range(rng.randint(0, 50))]
                     for _ in range(nseq)])
    return docs


def run(cli, *args):
    return subprocess.run([cli, *args], capture_output=True, text=True)


def expected_index(docs, itemsize):
    lengths = [len(s) for d in docs for s in d]
    pointers = list(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * itemsize)
    doc_idx = [0]
    for d in docs:
        doc_idx.append(doc_idx[-1] + len(d))
    return lengths, [int(p) for p in pointers], doc_idx


def test_we_write_numpy_reads(cli, tmp, rng):
    for dtype in RANGES:
        docs = random_documents(rng, dtype)
        spec = os.path.join(tmp, f"docs_{dtype}.json")
        with open(spec, "w") as f:
            json.dump(docs, f)
        ours = os.path.join(tmp, f"ours_{dtype}")
        r = run(cli, "write", ours, dtype, spec)
        check(f"write {dtype}", r.returncode == 0, r.stderr)
        if r.returncode:
            continue
        ds = mf.Dataset(ours)
        item = np.dtype(dtype).itemsize
        lengths, pointers, doc_idx = expected_index(docs, item)
        check(f"{dtype} version", ds.version == 1)
        check(f"{dtype} dtype code", mf.DTYPES[ds.code] == np.dtype(dtype), ds.code)
        check(f"{dtype} sequence count", ds.sequence_count == len(lengths))
        check(f"{dtype} document count", ds.document_count == len(docs) + 1)
        check(f"{dtype} lengths", list(ds.lengths) == lengths)
        check(f"{dtype} pointers", [int(p) for p in ds.pointers] == pointers)
        check(f"{dtype} document indices", [int(d) for d in ds.document_indices] == doc_idx)
        check(f"{dtype} idx size", ds.idx_size == 34 + 12 * len(lengths) + 8 * (len(docs) + 1))
        got = ds.documents()
        want = [[t for s in d for t in s] for d in docs]
        check(f"{dtype} tokens", got == want)
        ref = os.path.join(tmp, f"numpy_{dtype}")
        mf.write(ref, docs, dtype)
        for ext in (".bin", ".idx"):
            with open(ours + ext, "rb") as a, open(ref + ext, "rb") as b:
                check(f"{dtype} {ext} byte-identical to numpy's", a.read() == b.read())
        check(f"{dtype} no temporary files left",
              not any(n.startswith(f"ours_{dtype}") and n.endswith(".tmp") for n in os.listdir(tmp)))


def test_numpy_writes_we_read(cli, tmp, rng):
    for dtype in RANGES:
        docs = random_documents(rng, dtype)
        prefix = os.path.join(tmp, f"np_{dtype}")
        mf.write(prefix, docs, dtype)
        r = run(cli, "dump", prefix)
        check(f"dump {dtype}", r.returncode == 0, r.stderr)
        if r.returncode:
            continue
        got = json.loads(r.stdout)
        lengths, pointers, doc_idx = expected_index(docs, np.dtype(dtype).itemsize)
        check(f"read {dtype} dtype", got["dtype"] == dtype, got["dtype"])
        check(f"read {dtype} counts", (got["num_sequences"], got["num_documents"]) ==
              (len(lengths), len(docs)))
        check(f"read {dtype} lengths", got["sequence_lengths"] == lengths)
        check(f"read {dtype} pointers", got["sequence_pointers"] == pointers)
        check(f"read {dtype} document indices", got["document_indices"] == doc_idx)
        check(f"read {dtype} tokens", got["documents"] == docs)
        check(f"read {dtype} token count", got["num_tokens"] == sum(lengths))


def corrupt(tmp, name, mutate_idx=None, mutate_bin=None):
    prefix = os.path.join(tmp, name)
    mf.write(prefix, [[[1, 2, 3]], [[4, 5], [6]], [[7, 8, 9, 10]]], "uint16")
    for ext, mutate in ((".idx", mutate_idx), (".bin", mutate_bin)):
        if mutate:
            with open(prefix + ext, "rb") as f:
                b = bytearray(f.read())
            with open(prefix + ext, "wb") as f:
                f.write(mutate(b))
    return prefix


def set_at(offset, data):
    def mutate(b):
        b[offset:offset + len(data)] = data
        return b
    return mutate


def test_refused_files(cli, tmp):
    cases = [
        ("bad_magic", set_at(0, b"MMIDIDY"), None, ".idx", "bad magic"),
        ("version", set_at(9, (2).to_bytes(8, "little")), None, ".idx", "version"),
        ("dtype_code", set_at(17, bytes([9])), None, ".idx", "dtype code"),
        ("float_dtype", set_at(17, bytes([7])), None, ".idx", "float32"),
        ("short_header", lambda b: b[:20], None, ".idx", "truncated"),
        ("short_index", lambda b: b[:-5], None, ".idx", "truncated"),
        ("short_data", None, lambda b: b[:-3], ".bin", "truncated"),
        # S = 4 sequences, so the document indices start at 34 + 12 * 4; the last should be 4.
        ("last_doc_index", set_at(34 + 48 + 24, (3).to_bytes(8, "little")), None, ".idx",
         "last document index"),
        # The sequences lie back to back (pointers 0, 6, 10, 12 at byte 34 + 16): the uint16
        # code read as uint8 (byte-split tokens), two aliased pointers, a .bin with bytes past them.
        ("uint16_as_uint8", set_at(17, bytes([1])), None, ".idx", "the pointers step by 2 bytes a token"),
        ("aliased_pointer", set_at(34 + 16 + 16, (6).to_bytes(8, "little")), None, ".idx",
         "sequence 2 starts at byte 6"),
        ("appended_data", None, lambda b: b + b"\0\0", ".bin", "22 bytes, but its index"),
    ]
    for name, mi, mb, ext, word in cases:
        prefix = corrupt(tmp, name, mi, mb)
        r = run(cli, "dump", prefix)
        check(f"refuses {name}", r.returncode == 1, f"rc={r.returncode} {r.stdout[:200]}")
        check(f"{name} message names the file and problem",
              prefix + ext in r.stderr and word in r.stderr, r.stderr)
    # An index of another, shorter corpus beside this .bin: 2 of its 10 tokens described.
    prefix = corrupt(tmp, "other_index")
    mf.write(os.path.join(tmp, "other"), [[[1, 2]]], "uint16")
    os.replace(os.path.join(tmp, "other.idx"), prefix + ".idx")
    r = run(cli, "dump", prefix)
    check("refuses another corpus's index", r.returncode == 1 and prefix + ".bin" in r.stderr
          and "20 bytes, but its index" in r.stderr and "1 sequences of 2 tokens" in r.stderr, r.stderr)
    r = run(cli, "dump", os.path.join(tmp, "missing"))
    check("missing file", r.returncode == 1 and "missing.idx" in r.stderr, r.stderr)

    spec = os.path.join(tmp, "spec_too_big.json")
    with open(spec, "w") as f:
        json.dump([[[1, 2]], [[65536]]], f)
    prefix = os.path.join(tmp, "too_big")
    r = run(cli, "write", prefix, "uint16", spec)
    check("token outside uint16 refused", r.returncode == 1 and "65536" in r.stderr, r.stderr)
    check("a refused write leaves no file",
          not [n for n in os.listdir(tmp) if n.startswith("too_big.")], os.listdir(tmp))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    rng = random.Random(20240611)
    with tempfile.TemporaryDirectory() as tmp:
        test_we_write_numpy_reads(args.cli, tmp, rng)
        test_numpy_writes_we_read(args.cli, tmp, rng)
        test_refused_files(args.cli, tmp)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
