"""preprocess_data's token ids against Hugging Face `tokenizers` (a BPE model from the same two
files with GPT-2's ByteLevel pre-tokenizer, add_prefix_space=False), read back with the
independent numpy reader of megatron_format.py.

1. scripts/prepare_corpus.sh turns the fortunes package into JSON lines (checked against our own
   reading of the fortune files: one document per text between '%' lines) and runs the tool;
   every document is HF's ids + <|endoftext|>.
2. A multilingual corpus: generated text (accents precomposed and decomposed, Greek, Cyrillic,
   Arabic, Hebrew, Devanagari, Thai, CJK, kana, Hangul, emoji with ZWJ and skin tones, digits and
   numbers of many scripts, every kind of whitespace in runs, contractions, control characters),
   the translations in iso-codes' gettext catalogs (/usr/share/locale: names of countries,
   languages and scripts in ~150 languages) and every code point of planes 0, 1 and 14 (a sample beyond) between
   letters, digits and punctuation. Two keys at once, a list-of-sentences value, empty and blank documents; 3
   workers give byte-identical files to 1 worker.
Last line: "N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import gettext
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_format as mf  # noqa: E402

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {str(detail)[:2000]}")


def hf_tokenizer(bpe_dir):
    tok = Tokenizer(models.BPE.from_file(os.path.join(bpe_dir, "encoder.json"),
                                         os.path.join(bpe_dir, "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return tok


def hf_ids(tok, texts):
    return [e.ids for e in tok.encode_batch(texts)] if texts else []


def compare_documents(name, got_docs, want_docs, texts):
    check(f"{name}: document count", len(got_docs) == len(want_docs),
          f"{len(got_docs)} != {len(want_docs)}")
    bad = [i for i, (g, w) in enumerate(zip(got_docs, want_docs)) if g != w]
    detail = ""
    if bad:
        i = bad[0]
        g, w = got_docs[i], want_docs[i]
        k = next((k for k in range(min(len(g), len(w))) if g[k] != w[k]), min(len(g), len(w)))
        detail = (f"{len(bad)} documents differ; first: #{i} at token {k}: ours {g[k:k + 8]} "
                  f"HF {w[k:k + 8]}; text {texts[i][:200]!r}")
    check(f"{name}: every document's ids equal HF's", not bad, detail)


# ------------------------------------------------------------------------------------------
# 1. fortunes
# ------------------------------------------------------------------------------------------

def read_fortunes(directory):
    """The texts between lines holding only '%', from each fortune file (no dot in its name)."""
    texts = []
    for path in sorted(glob.glob(os.path.join(directory, "*"))):
        if "." in os.path.basename(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            content = f.read()
        for part in re.split(r"(?m)^%$", content):
            text = part.strip("\n")
            if text.strip():
                texts.append(text)
    return texts


def test_fortunes(args, tok, tmp):
    out = os.path.join(tmp, "fortunes")
    env = dict(os.environ, PREPROCESS_DATA=args.tool, GPT2_BPE_DIR=args.bpe_dir,
               DSCPP_PYTHON=sys.executable)
    t0 = time.time()
    r = subprocess.run(["bash", args.prepare, out], env=env, capture_output=True, text=True)
    check("prepare_corpus.sh succeeds", r.returncode == 0, r.stderr[-2000:])
    if r.returncode:
        return
    print(f"prepare_corpus.sh: {time.time() - t0:.1f} s; {r.stderr.strip().splitlines()[-2]}")
    check("the tool prints a summary", "documents" in r.stderr and "tokens/s" in r.stderr,
          r.stderr[-500:])
    with open(os.path.join(out, "fortunes.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    expected = read_fortunes(args.fortunes)
    check("one document per fortune", len(texts) == len(expected) and len(texts) > 10000,
          f"{len(texts)} vs {len(expected)}")
    check("documents are the fortunes' texts", texts == expected)
    ds = mf.Dataset(os.path.join(out, "fortunes_text_document"))
    check("GPT-2's vocabulary is stored as uint16", ds.dtype.name == "uint16", ds.dtype)
    want = [ids + [50256] for ids in hf_ids(tok, texts)]
    compare_documents("fortunes", ds.documents(), want, texts)
    total = sum(len(d) for d in want)
    print(f"fortunes: {len(texts)} documents, {total} tokens compared")


# ------------------------------------------------------------------------------------------
# 2. multilingual
# ------------------------------------------------------------------------------------------

SAMPLES = [
    "Où est la bibliothèque ? L'élève a répondu : « Je ne sais pas. » Ça coûte 12,50 €.",
    "Grüße aus Köln! Die Straße ist schön, aber der Fluß… Æsop's Œuvre; naïve façade.",
    "¿Dónde está el niño? ¡Mañana! Pingüino, corazón, ñandú.",
    "Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy. İstanbul'da ıslak ığdır.",
    "Ἐν ἀρχῇ ἦν ὁ λόγος. Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Ґанок, їжак, є.",
    "مرحبا بالعالم! هذا نصٌّ عربيٌّ مع تشكيل. الرقم ١٢٣٤٥ والسنة ٢٠٢٤.",
    "שלום עולם! זהו טקסט בעברית עם ניקוד: בְּרֵאשִׁית.",
    "नमस्ते दुनिया! यह हिन्दी में एक वाक्य है। संख्या १२३४ है।",
    "আমি বাংলায় গান গাই। ০১২৩৪৫৬৭৮৯",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ ๑๒๓",
    "我爱北京天安门。今天天气很好，我们去公园散步吧！第１２３号。",
    "東京は日本の首都です。ひらがな、カタカナ、漢字。ｶﾀｶﾅ半角。",
    "안녕하세요 세계! 한국어 문장입니다. 123번 버스.",
    "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ, Nguyễn, Đà Nẵng.",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 ❤️ 🤖💬 ✌︎ #️⃣ 1️⃣",
    "Numbers: ² ³ ½ ¾ Ⅻ ⅷ ① ⑳ １２３ ٤٥٦ ०१२ ๓๔ 𝟘𝟙𝟚 ፲፳ 〇一二",
    "Math & symbols: ∀x∈ℝ: x²≥0 → ∑ᵢ aᵢ ≤ ∞; ©®™ §¶ †‡ •… ‰ ′″ ←↑→↓ ⌘⌥",
    "Combining: e\u0301 a\u0300 o\u0308 n\u0303 Z\u0351\u0360\u0353a\u0358\u035d\u0352l\u0361g\u0317o\u0489",
    "I'm sure you're right, he'll say it's John's and we've 'd it; they'D NOT'VE; rock'n'roll ''s '",
    "Tabs\tand\t\tnewlines\n\nand  double  spaces   and\r\nCRLF\u00a0nbsp\u3000ideographic\u2009thin",
    "Control: \x00\x01\x1b[0m\x7f \x1c\x1d\x1e\x1f \u200b\u200c\u200d\u2060\ufeff \x85 \u2028\u2029",
    "Literal <|endoftext|> inside text, and <|endoftext|>x",
    "URLs: https://example.org/path?q=1&r=ü#frag and e-mail: user@example.com, $HOME/.bashrc",
    "Code: for (int i = 0; i < n; ++i) { sum += a[i] * 2.5e-3; }  // done\n\tif x: return None",
]
SEPARATORS = [" ", "  ", "   ", "\n", "\n\n", "\t", " \t ", "\r\n", "\u00a0", "\u3000", " \n ",
              "\u2009", "\x0b", "\x0c", "\u2028", "\u0085", " " * 17, "\n" * 5, "", "'", "-"]


def generated_documents(rng):
    docs = []
    for _ in range(1500):
        parts = []
        for _ in range(rng.randint(1, 12)):
            s = rng.choice(SAMPLES)
            if rng.random() < 0.3:
                s = unicodedata.normalize(rng.choice(["NFD", "NFKC", "NFKD"]), s)
            if rng.random() < 0.3:
                a = rng.randint(0, len(s))
                s = s[a:a + rng.randint(1, 40)]
            parts.append(s)
            parts.append(rng.choice(SEPARATORS))
        docs.append("".join(parts))
    return docs


def catalog_documents(limit_bytes):
    docs, size = [], 0
    # iso-codes' catalogs (in scripts/install.sh's apt list): names of countries, languages and
    # scripts in ~150 languages, the same on every machine of the project.
    for path in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/iso_*.mo")):
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except Exception:
            continue
        text = "\n".join(v for v in catalog.values() if isinstance(v, str) and v)
        if text.strip():
            docs.append(text)
            size += len(text.encode("utf-8"))
        if size > limit_bytes:
            break
    return docs


def code_point_documents():
    """Every code point of planes 0, 1 and 14 (and every 7th of the CJK planes 2-3, every 997th
    beyond) between letters, digits, punctuation and itself."""
    points = [c for c in range(0x20000) if not 0xD800 <= c <= 0xDFFF]
    points += list(range(0x20000, 0x40000, 7)) + list(range(0xE0000, 0xE1000))
    points += list(range(0x40000, 0x110000, 997))
    docs = []
    for k in range(0, len(points), 4096):
        docs.append("".join(f"a{chr(c)}b 7{chr(c)}. {chr(c)}{chr(c)}" for c in points[k:k + 4096]))
    return docs


def run_tool(args, jsonl, prefix, keys, workers):
    cmd = [args.tool, "--input", jsonl, "--json-keys", *keys, "--tokenizer-type",
           "GPT2BPETokenizer", "--vocab-file", os.path.join(args.bpe_dir, "encoder.json"),
           "--merge-file", os.path.join(args.bpe_dir, "vocab.bpe"), "--output-prefix", prefix,
           "--append-eod", "--workers", str(workers)]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(f"preprocess_data --workers {workers} succeeds", r.returncode == 0, r.stderr[-2000:])
    print(f"preprocess_data --workers {workers}: {time.time() - t0:.1f} s")
    return r.returncode == 0


def test_multilingual(args, tok, tmp):
    rng = random.Random(1234)
    catalogs = catalog_documents(2 << 20)
    n_catalog = len(catalogs)
    texts = generated_documents(rng) + catalogs + code_point_documents()
    texts += ["", "   ", "\n", "x", " ", "'s", "<|endoftext|>"]
    check("gettext catalogs found (apt package iso-codes)", n_catalog > 50, n_catalog)
    rng.shuffle(texts)
    titles = [t[:30].upper() for t in texts]
    sentences = ["First sentence. ", "", "Zweiter Satz — ünïcödé.", "  ", "最後の文。"]
    jsonl = os.path.join(tmp, "multi.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for i, (t, title) in enumerate(zip(texts, titles)):
            f.write(json.dumps({"text": t, "title": title, "n": i}) + "\n")
            if i == 10:
                f.write("\n")  # a blank line is skipped, not a document
        f.write(json.dumps({"text": sentences, "title": "list"}) + "\n")
    nbytes = os.path.getsize(jsonl)
    print(f"multilingual: {len(texts)} documents ({n_catalog} from gettext catalogs), "
          f"{nbytes / 1e6:.1f} MB")

    if not run_tool(args, jsonl, os.path.join(tmp, "w3"), ["text", "title"], 3):
        return
    if not run_tool(args, jsonl, os.path.join(tmp, "w1"), ["text"], 1):
        return
    for ext in (".bin", ".idx"):
        with open(os.path.join(tmp, "w3_text_document" + ext), "rb") as a, \
                open(os.path.join(tmp, "w1_text_document" + ext), "rb") as b:
            check(f"3 workers write the {ext} 1 worker writes", a.read() == b.read())

    eod = [50256]
    sentence_ids = [ids for ids in hf_ids(tok, sentences) if ids]
    for key, values in (("text", texts), ("title", titles)):
        ds = mf.Dataset(os.path.join(tmp, f"w3_{key}_document"))
        got = ds.documents()
        want = [ids + eod if ids else [] for ids in hf_ids(tok, values)]
        if key == "text":
            want.append([t for ids in sentence_ids for t in ids] + eod)
            last = len(got) - 1
            lo, hi = int(ds.document_indices[last]), int(ds.document_indices[last + 1])
            lengths = [int(x) for x in ds.lengths[lo:hi]]
            check("a list value gives one sequence per non-empty sentence, eod on the last",
                  lengths == [len(s) for s in sentence_ids[:-1]] + [len(sentence_ids[-1]) + 1],
                  lengths)
        else:
            want.append(hf_ids(tok, ["list"])[0] + eod)
        compare_documents(f"multilingual {key}", got, want, values + ["(sentences)"])
        empty = [i for i, d in enumerate(want) if not d]
        check(f"{key}: empty documents are kept with no sequence",
              all(ds.document_indices[i] == ds.document_indices[i + 1] for i in empty) and empty,
              empty)
        print(f"multilingual {key}: {sum(len(d) for d in want)} tokens compared")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--prepare", required=True)
    ap.add_argument("--bpe-dir", required=True)
    ap.add_argument("--fortunes", default="/usr/share/games/fortunes")
    args = ap.parse_args()
    tok = hf_tokenizer(args.bpe_dir)
    check("HF knows <|endoftext|> as 50256", tok.token_to_id("<|endoftext|>") == 50256)
    with tempfile.TemporaryDirectory() as tmp:
        test_fortunes(args, tok, tmp)
        test_multilingual(args, tok, tmp)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
