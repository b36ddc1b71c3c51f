"""Writes the seed corpora of the data fuzzers (tests/fuzz/corpus/<name>/).

index: small Megatron datasets from the independent numpy writer (megatron_format.py), each as
its .idx followed by its .bin, valid ones in every token dtype and edited ones for each way the
reader refuses a file.
tokenizer: toy GPT-2 vocabularies (the 256 byte tokens of GPT-2's alphabet and a few merges) as
the vocabulary JSON, a NUL byte and the merges file, valid and broken.

    .venv/bin/python tests/data/make_fuzz_seeds.py tests/fuzz/corpus
"""

import os
import struct
import sys
import tempfile

import json

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_format  # noqa: E402


def dataset(documents, dtype):
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "d")
        megatron_format.write(prefix, documents, dtype)
        with open(prefix + ".idx", "rb") as f:
            idx = f.read()
        with open(prefix + ".bin", "rb") as f:
            return idx, f.read()


def put(b, offset, value):
    return b[:offset] + value + b[offset + len(value):]


def byte_alphabet():
    """GPT-2's bytes_to_unicode, from its definition: printable Latin-1 bytes stand for
    themselves, the other 68 for U+0100 onwards in byte order."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def tokenizer_seeds(out):
    os.makedirs(out, exist_ok=True)
    vocab = {ch: b for b, ch in byte_alphabet().items()}
    space = byte_alphabet()[0x20]
    merges = ["#version: 0.2", "h e", "l l", "he ll", "hell o", space + " w", "o r", "or l",
              "orl d", space + "w orld"]
    for m in merges[1:]:
        left, right = m.split(" ")
        vocab[left + right] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    text = json.dumps(vocab, ensure_ascii=False)
    seeds = {
        "valid": text + "\0" + "\n".join(merges) + "\n",
        "valid_no_merges": json.dumps({ch: b for b, ch in byte_alphabet().items()}),
        "valid_escaped": json.dumps(vocab) + "\0" + "\r\n".join(merges),
        "syntax_error": text[:-40] + "\0h e\n",
        "nested": '{"a": {"b": [1, 2, {"c": 3}]}}',
        "not_an_object": "[1, 2, 3]\0a b\n",
        "bad_id": text[:-1] + ', "x": -5}\0',
        "bad_merge_line": text + "\0h e x\n",
        "unknown_merge": text + "\0q z\n",
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data.encode("utf-8"))


def main(root):
    tokenizer_seeds(os.path.join(root, "tokenizer"))
    out = os.path.join(root, "index")
    os.makedirs(out, exist_ok=True)
    seeds = {}
    docs = [[[1, 2, 3], [4, 5]], [], [[6, 7, 8, 9, 10, 11, 12]], [[127]]]
    for dtype in (np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64):
        idx, bin_ = dataset(docs, dtype)
        seeds[f"valid_{np.dtype(dtype).name}"] = idx + bin_
    idx, bin_ = dataset([], np.uint16)
    seeds["valid_empty"] = idx + bin_
    idx, bin_ = dataset([[[k % 300 for k in range(40)]] for _ in range(5)], np.uint16)
    seeds["valid_many_windows"] = idx + bin_

    idx, bin_ = dataset(docs, np.uint16)  # S = 4 sequences, D + 1 = 5 document indices
    s = 4
    lengths, pointers, doc_index = 34, 34 + 4 * s, 34 + 12 * s
    q = lambda v: struct.pack("<q", v)  # noqa: E731
    seeds["bad_magic"] = put(idx, 0, b"MMIDIDY") + bin_
    seeds["bad_version"] = put(idx, 9, struct.pack("<Q", 2)) + bin_
    seeds["bad_dtype_code"] = put(idx, 17, bytes([9])) + bin_
    seeds["float_dtype"] = put(idx, 17, bytes([7])) + bin_
    seeds["short_header"] = idx[:20]
    seeds["short_index"] = idx[:-5]
    seeds["short_data"] = idx + bin_[:-3]
    seeds["huge_counts"] = put(idx, 18, struct.pack("<QQ", 1 << 62, 1 << 62)) + bin_
    seeds["first_doc_index"] = put(idx, doc_index, q(1)) + bin_
    seeds["decreasing_doc_index"] = put(idx, doc_index + 16, q(0)) + bin_
    seeds["last_doc_index"] = put(idx, doc_index + 32, q(3)) + bin_
    seeds["negative_length"] = put(idx, lengths + 4, struct.pack("<i", -1)) + bin_
    seeds["negative_pointer"] = put(idx, pointers + 8, q(-2)) + bin_
    seeds["pointer_overflow"] = put(idx, pointers + 8, q((1 << 63) - 2)) + bin_
    seeds["token_past_vocab"] = idx + put(bin_, 2, struct.pack("<H", 60000))
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
