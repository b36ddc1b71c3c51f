"""train_gpt with tensor parallelism and dropout resumes exactly on the same layout.

A tensor-parallel GPT draws dropout in its split regions from the model-parallel RNG tracker
(differing per tensor rank) and in its replicated regions from the default generator; both
streams are in the checkpoint (each rank's `dscpp_rng_states` entry, the tracker's under
`rng_tracker_states`, as Megatron keeps them). With the model config's default dropouts (0.1),
on tensor 2 x pipeline 2 (4 CPU ranks) and tensor 2 without a pipeline (2 CPU ranks):
- 4 steps in one go with --save, and 3 steps with --save then --load and the 4th with --save:
  step 4 prints the uninterrupted run's loss and grad norm, and the two global_step4
  checkpoints are equal, every tensor bit for bit (weights, optimizer state, RNG states) but
  the save id. The ranks run with OMP_NUM_THREADS=1 (the Job's), so the float math is the same
  from run to run, and bit equality is the promise.
- The 4-rank checkpoint loaded on tensor 2 without a pipeline says its random-number states are
  not restored (another layout), and trains.
"""
import argparse
import glob
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import FAILED, Job, check, megatron_format, write_json  # noqa: E402
from test_train_gpt_pipeline_checkpoint import lines  # noqa: E402

# What differs between two saves of the same state: the id binding one save's files together.
VOLATILE = {"dscpp_save_id"}
# Not training state: the head's copy of the tied embedding (the last layer file of a pipeline)
# holds a position table it never uses, frozen (docs/pipeline.md). A load fills it from the
# embedding's layer file (the tied module's first holder), an uninterrupted run keeps its
# initial values. The files' digests in dscpp_pipe follow it; the files are compared themselves.


def differences(a, b, where=""):
    """Where two loaded checkpoint values differ (tensors bit for bit), as a list of paths."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where} keys {sorted(map(str, set(a) ^ set(b)))}"]
        return [d for k in a if k not in VOLATILE for d in differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where} lengths {len(a)} {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def checkpoint_differences(tag_a, tag_b, head_layer=None):
    """Every difference between two tags' files; with head_layer (a pipeline's last layer file
    prefix), what UNUSED names there and in the digests is left out."""
    import torch
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(tag_a, "*.pt")))
    other = sorted(os.path.basename(p) for p in glob.glob(os.path.join(tag_b, "*.pt")))
    if not names or names != other:
        return [f"files {names} vs {other}"]
    out = []
    for name in names:
        a = torch.load(os.path.join(tag_a, name), map_location="cpu", weights_only=False)
        b = torch.load(os.path.join(tag_b, name), map_location="cpu", weights_only=False)
        for d in differences(a, b, name):
            unused = head_layer and (d.startswith(head_layer) and d.endswith("/position.weight")
                                     or "/dscpp_pipe/layers[" in d and "/digest:" in d)
            if not unused:
                out.append(d)
    return out


def tracker_saved(tag):
    """Whether every model-states file holds each data rank's tracker states."""
    import torch
    files = glob.glob(os.path.join(tag, "mp_rank_*_model_states.pt"))
    for path in files:
        states = torch.load(path, map_location="cpu", weights_only=False)["dscpp_rng_states"]
        if not all("model-parallel-rng" in s.get("rng_tracker_states", {}) for s in states):
            return False
    return bool(files)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(3 * i + j) % 64 for j in range(70)]] for i in range(40)], "uint16")
        # No dropout keys: the model config's defaults, Megatron's 0.1 each.
        shape = {"hidden_size": 32, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16,
                 "vocab_size": 128, "ffn_hidden_size": 64, "tie_word_embeddings": True}
        ds = write_json(os.path.join(tmp, "ds.json"), {
            "train_batch_size": 4, "gradient_accumulation_steps": 2, "steps_per_print": 1 << 30,
            "gradient_clipping": 1.0, "zero_optimization": {"stage": 1},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}}})
        common = ["--deepspeed_config", ds, "--data-path", prefix, "--log-interval", "1", "--seed", "5"]
        cases = (("tensor 2 x pipeline 2", {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}, 4),
                 ("tensor 2", {"tensor_model_parallel_size": 2}, 2))
        saved = {}
        for name, parallelism, ranks in cases:
            job.model = write_json(os.path.join(tmp, f"gpt{ranks}.json"), dict(shape, parallelism=parallelism))
            full, part = os.path.join(tmp, f"full{ranks}"), os.path.join(tmp, f"part{ranks}")
            rc, log_full = job.run(*common, "--train-iters", "4", "--save", full, ranks=ranks)
            check(f"{name}: 4 steps with dropout 0.1", rc == 0 and len(lines(log_full)) == 4, log_full)
            rc, log_a = job.run(*common, "--train-iters", "3", "--save", part, ranks=ranks)
            check(f"{name}: 3 steps, saved", rc == 0 and lines(log_a) == lines(log_full)[:3], log_a)
            check(f"{name}: each rank's tracker states are in the checkpoint",
                  rc == 0 and tracker_saved(os.path.join(part, "global_step3")), log_a)
            rc, log_b = job.run(*common, "--train-iters", "4", "--load", part, "--save", part, ranks=ranks)
            check(f"{name}: resumed at step 3, step 4 prints the uninterrupted run's loss and grad norm",
                  rc == 0 and "at step 3" in log_b and "not restored" not in log_b
                  and lines(log_b) == lines(log_full)[3:],
                  "\n".join(lines(log_b)) + "\n---\n" + "\n".join(lines(log_full)) + "\n" + log_b)
            # The pipeline's layers: embedding 0, blocks 1-2, final norm 3, the tied head 4.
            diff = checkpoint_differences(os.path.join(full, "global_step4"), os.path.join(part, "global_step4"),
                                          "layer_04-" if "pipeline_model_parallel_size" in parallelism else None)
            check(f"{name}: the resumed run's step-4 checkpoint is the uninterrupted run's, bit for bit",
                  not diff, "\n".join(diff[:20]))
            saved[ranks] = part
        # Another layout: the weights load, the random-number states do not, and it says so.
        job.model = write_json(os.path.join(tmp, "gpt2.json"),
                               dict(shape, parallelism={"tensor_model_parallel_size": 2}))
        rc, log_o = job.run(*common, "--train-iters", "5", "--load", saved[4], ranks=2)
        check("the tensor 2 x pipeline 2 checkpoint on tensor 2: trains on, its random-number states not restored",
              rc == 0 and "at step 4" in log_o and "random-number states are not restored" in log_o
              and len(lines(log_o)) == 1, log_o)
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {FAILED}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
