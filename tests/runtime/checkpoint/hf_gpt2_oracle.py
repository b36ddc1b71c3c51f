#!/usr/bin/env python3
"""tools/convert_checkpoint against Hugging Face's transformers (GPT2LMHeadModel) and
safetensors, both ways, with logits compared:

1. a tiny GPT trained 4 steps by train_gpt (ZeRO-1), consolidated by zero_to_fp32, converted
   --to hf: safetensors' own reader opens model.safetensors and finds every tensor (Conv1D
   weights the transpose of ours); GPT2LMHeadModel.from_pretrained loads it without missing
   or unexpected keys, and its logits equal ours within 1e-5 (fp32); converted --dtype bf16,
   both sides in bf16 agree within bf16's tolerance (3e-2 of the logits' scale);
2. a GPT-2 (untied head, exact GELU) made by transformers and saved with save_pretrained
   (its safetensors), converted --to dscpp (and its config with --model-config-out), loads
   into our GPT, whose logits equal transformers' within 1e-5; truncated or malformed
   safetensors files give an error naming the file;
3. Llama's layout (a transformers Llama config.json, --format llama) refused with the reason:
   model_zoo has no RMSNorm/RoPE/SwiGLU blocks yet.

    hf_gpt2_oracle.py --convert build/tools/convert_checkpoint --logits build/tests/runtime/checkpoint/gpt_logits \
        --train-gpt build/examples/train_gpt --zero-to-fp32 build/tools/zero_to_fp32"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "data"))

import torch  # noqa: E402

TINY = {"hidden_size": 32, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16, "vocab_size": 96,
        "ffn_hidden_size": 64, "hidden_dropout": 0.0, "attention_dropout": 0.0, "layernorm_epsilon": 1e-5,
        "init_method_std": 0.02, "tie_word_embeddings": True, "gelu_approximation": "tanh"}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def our_logits(args, tmp, cfg, weights, ids, dtype="fp32"):
    ids_path, out = os.path.join(tmp, "ids.pt"), os.path.join(tmp, f"ours_{dtype}.pt")
    torch.save(ids, ids_path)
    run([args.logits, "--model-config", cfg, "--weights", weights, "--ids", ids_path, "--out", out, "--dtype", dtype])
    return torch.load(out)


def part_to_hf(args, tmp, check):
    import megatron_format
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel
    prefix = os.path.join(tmp, "tokens")
    megatron_format.write(prefix, [[[(7 * i + 3 * j) % 96 for j in range(40)]] for i in range(16)], "uint16")
    cfg = os.path.join(tmp, "gpt.json")
    with open(cfg, "w") as f:
        json.dump(TINY, f)
    ds = os.path.join(tmp, "ds.json")
    with open(ds, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                   "zero_optimization": {"stage": 1}, "steps_per_print": 1 << 30}, f)
    ckpt = os.path.join(tmp, "ckpt")
    run([args.train_gpt, "--model-config", cfg, "--train-data-path", prefix, "--deepspeed_config", ds,
         "--train-iters", "4", "--save", ckpt])
    weights = os.path.join(tmp, "fp32.pt")
    run([args.zero_to_fp32, ckpt, weights])
    sd = torch.load(weights)
    hf_dir = os.path.join(tmp, "hf")
    run([args.convert, "--to", "hf", "--input", weights, "--model-config", cfg, "--output", hf_dir])
    st = load_file(os.path.join(hf_dir, "model.safetensors"))
    check("safetensors reads our file: every tensor, Conv1D transposed",
          torch.equal(st["transformer.h.1.attn.c_attn.weight"], sd["blocks.1.attn.qkv.weight"].t())
          and torch.equal(st["transformer.wte.weight"], sd["embedding.word.weight"]) and len(st) == 4 + 12 * 2,
          sorted(st))
    model, info = GPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True)
    model.eval()
    missing = [k for k in info["missing_keys"] if k != "lm_head.weight"]
    check("from_pretrained: no missing or unexpected keys, lm_head tied to wte",
          not missing and not info["unexpected_keys"] and model.lm_head.weight.data_ptr()
          == model.transformer.wte.weight.data_ptr(), str(info))
    ids = torch.tensor([[(5 * i + 1) % 96 for i in range(16)], [(11 * i + 7) % 96 for i in range(16)]])
    with torch.no_grad():
        theirs = model(ids).logits.float()
    ours = our_logits(args, tmp, cfg, weights, ids)
    check("trained GPT -> GPT-2: logits equal (fp32, 1e-5)", rel(ours, theirs) < 1e-5, f"{rel(ours, theirs):.2e}")
    # Both in bf16: the converted file holds bf16 tensors and transformers runs in bf16.
    hf16 = os.path.join(tmp, "hf_bf16")
    run([args.convert, "--to", "hf", "--input", ckpt, "--model-config", cfg, "--output", hf16, "--dtype", "bf16"])
    st16 = load_file(os.path.join(hf16, "model.safetensors"))
    model16 = GPT2LMHeadModel.from_pretrained(hf16, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        theirs16 = model16(ids).logits.float()
    ours16 = our_logits(args, tmp, cfg, weights, ids, "bf16")
    check("bf16 file and model (from the checkpoint folder): logits within bf16's tolerance (3e-2)",
          all(t.dtype == torch.bfloat16 for t in st16.values()) and next(model16.parameters()).dtype ==
          torch.bfloat16 and rel(ours16, theirs16) < 3e-2 and rel(theirs16, theirs) < 3e-2,
          f"ours vs theirs {rel(ours16, theirs16):.2e}, bf16 vs fp32 {rel(theirs16, theirs):.2e}")


def part_from_hf(args, tmp, check):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    conf = GPT2Config(vocab_size=80, n_positions=24, n_embd=48, n_layer=2, n_head=4, n_inner=None,
                      activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      tie_word_embeddings=False)
    model = GPT2LMHeadModel(conf).eval()
    with torch.no_grad():  # biases and LayerNorms away from their init, so that each one counts
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf_dir = os.path.join(tmp, "from_hf")
    model.save_pretrained(hf_dir)
    check("transformers saved safetensors", os.path.isfile(os.path.join(hf_dir, "model.safetensors")),
          str(os.listdir(hf_dir)))
    weights, cfg = os.path.join(tmp, "from_hf.pt"), os.path.join(tmp, "from_hf_gpt.json")
    run([args.convert, "--to", "dscpp", "--input", hf_dir, "--output", weights, "--model-config-out", cfg])
    with open(cfg) as f:
        c = json.load(f)
    check("the GPT config: untied, exact GELU, ffn 4h",
          c["tie_word_embeddings"] is False and c["gelu_approximation"] == "none" and c["ffn_hidden_size"] in (0, 192),
          str(c))
    ids = torch.tensor([[(3 * i + 2) % 80 for i in range(24)]])
    with torch.no_grad():
        theirs = model(ids).logits.float()
    ours = our_logits(args, tmp, cfg, weights, ids)
    check("GPT-2 saved by transformers -> our GPT: logits equal (fp32, 1e-5)", rel(ours, theirs) < 1e-5,
          f"{rel(ours, theirs):.2e}")
    # Broken files: a clear error naming the file, never a crash.
    st_path = os.path.join(hf_dir, "model.safetensors")
    with open(st_path, "rb") as f:
        good = f.read()
    header_len = int.from_bytes(good[:8], "little")
    for what, data, want in (("truncated", good[:len(good) // 2], "outside the"),
                             ("header longer than the file", (1 << 40).to_bytes(8, "little") + good[8:],
                              "exceeds the file"),
                             ("header not JSON", good[:8] + b"{" * header_len + good[8 + header_len:], "header JSON")):
        with open(st_path, "wb") as f:
            f.write(data)
        p = subprocess.run([args.convert, "--to", "dscpp", "--input", hf_dir, "--output", weights],
                           capture_output=True, text=True)
        check(f"a {what} safetensors file: an error naming it", p.returncode == 1 and st_path in p.stderr
              and want in p.stderr, p.stderr[-500:])


def part_llama_refused(args, tmp, check):
    """model_zoo has no RMSNorm, RoPE or SwiGLU block, so Llama's layout is not converted: a
    Llama checkpoint folder (its config.json as transformers writes it) and --format llama are
    refused with the reason, never read as GPT-2."""
    folder = os.path.join(tmp, "llama")
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 172,
                   "rms_norm_eps": 1e-6, "vocab_size": 128, "max_position_embeddings": 32}, f)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # an empty safetensors file
    p = subprocess.run([args.convert, "--to", "dscpp", "--input", folder, "--output", os.path.join(tmp, "l.pt")],
                       capture_output=True, text=True)
    check("a Llama checkpoint: refused, naming model_type 'llama' and the one layout read",
          p.returncode != 0 and "model_type is 'llama'" in p.stderr
          and "only GPT-2's layout converts" in p.stderr,
          p.stdout + p.stderr)
    p = subprocess.run([args.convert, "--format", "llama", "--to", "dscpp", "--input", folder, "--output",
                        os.path.join(tmp, "l.pt")], capture_output=True, text=True)
    check("--format llama: refused, only gpt2 until the blocks exist",
          p.returncode != 0 and "--format 'llama'" in p.stderr and "RMSNorm/RoPE/SwiGLU" in p.stderr,
          p.stdout + p.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--train-gpt", dest="train_gpt", required=True)
    ap.add_argument("--zero-to-fp32", dest="zero_to_fp32", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hf_gpt2_")
    failures = []

    def check(name, ok, detail=""):
        print(f"{'PASS' if ok else 'FAIL'} {name}{'' if ok else ': ' + detail[:1500]}", flush=True)
        if not ok:
            failures.append(name)

    for part in (part_to_hf, part_from_hf, part_llama_refused):
        try:
            part(args, tmp, check)
        except Exception as e:  # noqa: BLE001
            check(f"{part.__name__} (aborted)", False, str(e))
    if failures:
        print(f"outputs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
