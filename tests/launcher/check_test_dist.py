"""`dscpp --num_gpus=2 test_dist.py`, from the script's folder, with DSCPP_PYTHON naming the
interpreter: each rank sees the launch contract (and --local_rank after the script), and where
torch is importable, torch.distributed's env:// rendezvous over Gloo sums the ranks (0+1 = 1)."""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/
from dscpp_test_ports import free_port  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--python", required=True)
    a = ap.parse_args()
    port = free_port()
    env = dict(os.environ, DSCPP_PYTHON=a.python, OMP_NUM_THREADS="1")
    p = subprocess.run([a.launcher, "--num_gpus=2", f"--master_port={port}", "test_dist.py"], cwd=HERE, env=env,
                       capture_output=True, text=True, timeout=280)
    out = p.stdout + p.stderr
    want = [f"test_dist: argv=--local_rank={r} RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
            f"MASTER_PORT={port}" for r in range(2)]
    has_torch = subprocess.run([a.python, "-c", "import torch"], capture_output=True).returncode == 0
    if has_torch:
        want += ["test_dist: rank 0: 0+1 = 1", "test_dist: rank 1: 0+1 = 1"]
    missing = [w for w in want if w not in out]
    if p.returncode != 0 or missing:
        print(out)
        print(f"FAIL: exit {p.returncode}; missing lines: {missing}")
        return 1
    print(out)
    print("PASS: test_dist.py ran under the launcher" + (" with torch's all-reduce" if has_torch else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
