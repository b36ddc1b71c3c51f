#!/usr/bin/env python3
"""Runs a command and prints the peak resident memory of the largest process it started.

    peak_rss.py COMMAND ARGS...     ->  its output, then "peak_rss_gib=X" on stderr; its exit code

getrusage(RUSAGE_CHILDREN)'s ru_maxrss is the largest resident set among the waited-for
descendants (the launcher waits for its ranks), in KiB on Linux. Pinned (page-locked) host
memory is resident, so the ZeRO-Offload buffers count. GiB = 2^30 bytes."""
import resource
import subprocess
import sys


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    rc = subprocess.call(sys.argv[1:])
    kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"peak_rss_gib={kib / 2**20:.3f}", file=sys.stderr, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
