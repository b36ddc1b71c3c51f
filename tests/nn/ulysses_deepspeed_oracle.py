#!/usr/bin/env python3
"""DeepSpeed's own Ulysses layer as the oracle for dscpp's (CPU ranks, Gloo).

    ulysses_deepspeed_oracle.py --cli build/tests/nn/ulysses_cli --launcher build/launcher/dscpp

For each case, p processes run deepspeed.sequence.layer.DistributedAttention (its
_SeqAllToAll on all_to_all_single) around causal SDPA on their slice of the sequence of
float64 q [B, S, Hq, d], k, v [B, S, Hkv, d] (batch first), back-propagating grad_out's slice;
then ulysses_cli runs dscpp's all-to-alls (nn/tensor_parallel_mappings.h) around the same
attention on p ranks through the launcher. Each rank's output and q, k, v gradients must equal
DeepSpeed's (float64, 1e-12 of the largest value), and both must equal attention over the whole
sequence in one process; the q, k and v heads each rank attends over must be DeepSpeed's, and
the ranks' blocks in rank order the whole q, k and v. Cases: p 2 with grouped-query heads, p 4
multi-head, and DeepSpeed's uneven split of heads where p does not divide the key/value heads:
3 heads on p 2, 10 heads in 5 key/value groups on p 4. Fewer key/value heads than ranks, which
DeepSpeed refuses, must be refused by ulysses_cli. Prints one line per case and `N passed, M
failed`."""
import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dscpp_test_ports import free_port  # noqa: E402

TOL = 1e-12
# Two ranks with grouped-query heads (one key/value head a rank), four with multi-head: each
# case's DeepSpeed side pays DeepSpeed's start-up, so the pair covers both axes. Then the uneven
# split: 3 heads on 2 ranks (2 and 1), and 5 key/value groups of 2 query heads on 4 ranks (2, 1,
# 1, 1 groups: the first 5 % 4 ranks take one more).
CASES = [
    dict(name="p2_gqa", p=2, b=2, s=12, hq=8, hkv=2, d=4),
    dict(name="p4_mha", p=4, b=1, s=16, hq=8, hkv=8, d=4),
    dict(name="p2_mha_uneven", p=2, b=2, s=12, hq=3, hkv=3, d=4),
    dict(name="p4_gqa_uneven", p=4, b=1, s=16, hq=10, hkv=5, d=4),
]
# DeepSpeed asserts at least one key/value head a rank (sequence/layer.py, _resolve_kv_heads).
REFUSED = dict(name="p4_kv2_refused", p=4, b=1, s=16, hq=4, hkv=2, d=4)


def attention(q, k, v):
    """Causal SDPA on batch-first [B, S, H, d] tensors, key/value heads shared (GQA)."""
    t = lambda x: x.transpose(1, 2)
    return t(torch.nn.functional.scaled_dot_product_attention(
        t(q), t(k), t(v), is_causal=True, enable_gqa=q.shape[2] != k.shape[2]))


def inputs(c):
    g = torch.Generator().manual_seed(sum(map(ord, c["name"])))
    rand = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)
    return dict(q=rand(c["b"], c["s"], c["hq"], c["d"]), k=rand(c["b"], c["s"], c["hkv"], c["d"]),
                v=rand(c["b"], c["s"], c["hkv"], c["d"]), grad_out=rand(c["b"], c["s"], c["hq"], c["d"]))


class SequenceMpu:
    """The sequence-parallel part of a Megatron-style mpu, as deepspeed.utils.groups reads it."""

    def __init__(self, dist, group):
        self.dist, self.group = dist, group

    def get_sequence_parallel_group(self):
        return self.group

    def get_sequence_parallel_rank(self):
        return self.dist.get_rank(self.group)

    def get_sequence_parallel_world_size(self):
        return self.dist.get_world_size(self.group)


def deepspeed_rank(rank, c, port, tensors, out_dir):
    import datetime
    import deepspeed.comm as dist
    from deepspeed.sequence.layer import DistributedAttention
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(c["p"]),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(c["p"]))
    torch.set_num_threads(1)
    dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False,
                          timeout=datetime.timedelta(seconds=60))
    sl = c["s"] // c["p"]
    mine = lambda t: t.narrow(1, rank * sl, sl).contiguous()
    q, k, v = (mine(tensors[n]).requires_grad_() for n in ("q", "k", "v"))
    from deepspeed.utils import groups
    group = dist.new_group(list(range(c["p"])))
    # DeepSpeed's uneven split reads this rank's place from the model's mpu (the engine's
    # `mpu` argument); one that knows the sequence group.
    groups.mpu = SequenceMpu(dist, group)
    held = {}

    def local_attention(*qkv):  # keeps the heads this rank was given
        held.update((n, x.detach().contiguous()) for n, x in zip(("hq", "hk", "hv"), qkv))
        return attention(*qkv)

    layer = DistributedAttention(local_attention, group, scatter_idx=2, gather_idx=1)
    out = layer(q, k, v, 0)
    out.backward(mine(tensors["grad_out"]))
    save_file({"out": out.detach().contiguous(), "dq": q.grad, "dk": k.grad, "dv": v.grad, **held},
              os.path.join(out_dir, f"{c['name']}.deepspeed{rank}.safetensors"))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--launcher", required=True)
    args = ap.parse_args()
    passed, failed = 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for c in CASES:
            t = inputs(c)
            path = os.path.join(tmp, c["name"] + ".safetensors")
            save_file(t, path)
            mp.spawn(deepspeed_rank, args=(c, free_port(), t, tmp), nprocs=c["p"], join=True)
            run = subprocess.run([args.launcher, "--num_gpus", str(c["p"]), "--master_port", str(free_port()),
                                  args.cli, path], capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                failed.append(c["name"])
                print(f"FAIL {c['name']}: ulysses_cli exited {run.returncode}\n{run.stdout}{run.stderr}")
                continue
            # The whole sequence in one process: what both must equal.
            q, k, v = (t[n].clone().requires_grad_() for n in ("q", "k", "v"))
            whole = attention(q, k, v)
            whole.backward(t["grad_out"])
            ref = {"out": whole.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
            sl = c["s"] // c["p"]
            worst = {"deepspeed": 0.0, "whole": 0.0}
            blocks = {"hq": [], "hk": [], "hv": []}
            same_heads = True
            for r in range(c["p"]):
                ours = load_file(os.path.join(tmp, f"{c['name']}.rank{r}.safetensors"))
                theirs = load_file(os.path.join(tmp, f"{c['name']}.deepspeed{r}.safetensors"))
                for n, x in ours.items():
                    if n in blocks:  # the heads attention got: DeepSpeed's, bit for bit
                        same_heads = same_heads and x.shape == theirs[n].shape and torch.equal(x, theirs[n])
                        blocks[n].append(x)
                        continue
                    scale = ref[n].abs().max().item()
                    worst["deepspeed"] = max(worst["deepspeed"], (x - theirs[n]).abs().max().item() / scale)
                    worst["whole"] = max(worst["whole"], (x - ref[n].narrow(1, r * sl, sl)).abs().max().item() / scale)
            # The ranks' blocks, in rank order, are every head of the whole sequence once.
            same_heads = same_heads and all(torch.equal(torch.cat(blocks["h" + n], 2), t[n]) for n in "qkv")
            ok = worst["deepspeed"] <= TOL and worst["whole"] <= TOL and same_heads
            passed += ok
            if not ok:
                failed.append(c["name"])
            print(f"{'PASS' if ok else 'FAIL'} {c['name']}: against DeepSpeed {worst['deepspeed']:.1e}, "
                  f"against the whole sequence {worst['whole']:.1e}, "
                  f"each rank's heads {'as' if same_heads else 'NOT as'} DeepSpeed's")
        c = REFUSED
        path = os.path.join(tmp, c["name"] + ".safetensors")
        save_file(inputs(c), path)
        run = subprocess.run([args.launcher, "--num_gpus", str(c["p"]), "--master_port", str(free_port()),
                              args.cli, path], capture_output=True, text=True, timeout=120)
        said = run.stdout + run.stderr
        ok = run.returncode != 0 and "4 attention heads in 2 key/value groups" in said and "at least 4" in said
        passed += ok
        if not ok:
            failed.append(c["name"])
        print(f"{'PASS' if ok else 'FAIL'} {c['name']}: 2 key/value heads on 4 ranks refused"
              + ("" if ok else f"\n{said}"))
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
