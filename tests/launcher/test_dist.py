"""The seed's distributed check, in the style of its test_dist.py: run as
`dscpp --num_gpus=2 test_dist.py` (the launcher runs a .py program with $DSCPP_PYTHON or python3).
Prints the launch contract each rank sees and, where torch is importable, all-reduces the ranks
over Gloo with torch.distributed's env:// rendezvous."""
import os
import sys

env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
print("test_dist: argv=" + " ".join(sys.argv[1:]) + " " + " ".join(f"{k}={v}" for k, v in env.items()), flush=True)
try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("test_dist: no torch here; environment only", flush=True)
    sys.exit(0)
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
n = dist.get_world_size()
print(f"test_dist: rank {dist.get_rank()}: {'+'.join(str(r) for r in range(n))} = {int(t.item())}", flush=True)
dist.destroy_process_group()
