"""Megatron-LM's indexed dataset (.bin/.idx), read and written with numpy from the format's
description alone (megatron/core/datasets/indexed_dataset.py: _IndexWriter, _IndexReader), as an
independent reference for dscpp's C++ reader and writer."""

import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


class Dataset:
    """header fields, the three index arrays (memory-mapped) and the token file."""

    def __init__(self, prefix):
        idx = np.memmap(prefix + ".idx", mode="r", dtype=np.uint8)
        head = bytes(idx[:34])
        if head[:9] != MAGIC:
            raise ValueError(f"{prefix}.idx: bad magic {head[:9]!r}")
        (self.version,) = struct.unpack("<Q", head[9:17])
        self.code = head[17]
        self.dtype = np.dtype(DTYPES[self.code])
        self.sequence_count, self.document_count = struct.unpack("<QQ", head[18:34])
        s, d = self.sequence_count, self.document_count
        buf = idx.tobytes()
        self.lengths = np.frombuffer(buf, np.int32, s, 34)
        self.pointers = np.frombuffer(buf, np.int64, s, 34 + 4 * s)
        self.document_indices = np.frombuffer(buf, np.int64, d, 34 + 12 * s)
        self.idx_size = len(buf)
        self.bin = np.memmap(prefix + ".bin", mode="r", dtype=np.uint8)

    def sequence(self, i):
        start = int(self.pointers[i])
        n = int(self.lengths[i]) * self.dtype.itemsize
        return np.frombuffer(self.bin[start:start + n].tobytes(), self.dtype)

    def documents(self):
        """Each document's tokens (its sequences concatenated) as a list of int lists."""
        out = []
        for d in range(len(self.document_indices) - 1):
            lo, hi = int(self.document_indices[d]), int(self.document_indices[d + 1])
            toks = []
            for i in range(lo, hi):
                toks += self.sequence(i).tolist()
            out.append(toks)
        return out


def write(prefix, documents, dtype):
    """documents: a list of documents, each a list of sequences (lists of ints)."""
    dtype = np.dtype(dtype)
    lengths, doc_idx = [], [0]
    with open(prefix + ".bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                f.write(np.asarray(seq, dtype=dtype).tobytes())
                lengths.append(len(seq))
            doc_idx.append(len(lengths))
    pointers = np.zeros(len(lengths), np.int64)
    pointers[1:] = np.cumsum(np.asarray(lengths[:-1], np.int64) * dtype.itemsize)
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(np.asarray(lengths, np.int32).tobytes())
        f.write(pointers.tobytes())
        f.write(np.asarray(doc_idx, np.int64).tobytes())
