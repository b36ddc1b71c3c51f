#!/usr/bin/env bash
# Builds the default training corpus: the English fortunes of Debian's `fortunes` package as
# OUT_DIR/fortunes.jsonl (one fortune a document: the text between lines holding only '%'), then
# OUT_DIR/fortunes_text_document.bin/.idx through preprocess_data with GPT-2's BPE.
# Environment: PREPROCESS_DATA (default build/tools/preprocess_data), GPT2_BPE_DIR (default
# data/gpt2_bpe, a copy of GPT-2s files), FORTUNES_DIR (default /usr/share/games/fortunes), DSCPP_PYTHON.
set -euo pipefail
out=${1:?usage: scripts/prepare_corpus.sh OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
tool=${PREPROCESS_DATA:-$root/build/tools/preprocess_data}
bpe=${GPT2_BPE_DIR:-$root/data/gpt2_bpe}
fortunes=${FORTUNES_DIR:-/usr/share/games/fortunes}
[ -d "$fortunes" ] || { echo "prepare_corpus: no $fortunes (apt-get install fortunes)" >&2; exit 1; }
mkdir -p "$out"
# Fortune files are the ones without a dot (.dat is strfile's index, .u8 a link to the text).
"${DSCPP_PYTHON:-python3}" - "$fortunes" "$out/fortunes.jsonl" <<'PY'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
with open(dst, "w", encoding="utf-8") as out:
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if "." in name or not os.path.isfile(path):
            continue
        doc = []
        for line in open(path, encoding="utf-8").read().split("\n") + ["%"]:
            if line != "%":
                doc.append(line)
                continue
            text = "\n".join(doc).strip("\n")
            if text.strip():
                out.write(json.dumps({"text": text, "source": name}, ensure_ascii=False) + "\n")
            doc = []
PY
"$tool" --input "$out/fortunes.jsonl" --json-keys text --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$bpe/encoder.json" --merge-file "$bpe/vocab.bpe" \
  --output-prefix "$out/fortunes" --append-eod --workers "$(nproc)"
