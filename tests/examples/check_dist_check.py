"""examples/dist_check through the launcher on N CPU ranks: every rank exits 0 and rank 0 prints the
seed's sum, 0+1+...+(N-1) = N(N-1)/2 (0+1+...+7 = 28 on 8)."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dscpp_test_ports import free_port  # noqa: E402

launcher, program, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = subprocess.run([launcher, f"--num_gpus={n}", f"--master_port={free_port()}", program],
                   capture_output=True, text=True, timeout=100)
out = p.stdout + p.stderr
expected = f"dist_check: 0+1+...+{n - 1} = {n * (n - 1) // 2} ({n} ranks, gloo): ok"
print(out)
if p.returncode != 0 or out.count(expected) != 1:
    print(f"FAIL: exit status {p.returncode}; expected the line once: {expected}")
    sys.exit(1)
print("PASS")
