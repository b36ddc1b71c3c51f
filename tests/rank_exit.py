"""How a DeepSpeed rank of a test ends: every rank past a barrier, then out without teardown.

Left to the interpreter's exit, or even after destroy_process_group(), a Gloo rank of DeepSpeed
now and then aborts with "terminate called without an active exception" (CI's logs show it on
both; PyTorch's pull request 179291 traces it to Gloo work objects that still hold tensors while
the interpreter finalises). Once every rank is past the last barrier, its outputs are written
and nothing is left to do, so the rank leaves with os._exit: no destructor runs, none can abort."""
import os
import sys


def exit_rank(code=0):
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
