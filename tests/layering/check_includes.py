#!/usr/bin/env python3
"""The layer table of docs/architecture.md, checked: lists every cross-folder #include of the
library's non-test code and fails on one that the table does not allow.

The build enforces the table too (each folder's target sees only the headers of the folders
it links), but only up to the transitive closure of the links; this check holds each folder
to its own row. It also refuses project includes not spelled "dscpp/<folder>/...", which
would only resolve inside this source tree, and LibTorch in the launcher.
Usage: check_includes.py SOURCE_ROOT [--list]
"""
import os
import re
import sys

# folder -> the folders its row may use (docs/architecture.md).
MAY_USE = {
    "config": set(),
    "comm": set(),
    "data": set(),
    "ops": set(),
    "nn": {"comm", "ops", "config"},
    "optim": {"config", "ops"},
    "model_zoo": {"nn", "ops", "config", "comm"},
    "zero": {"comm", "optim", "nn", "ops"},
    "runtime": {"config", "comm", "ops", "nn", "optim", "zero"},
    "pipe": {"runtime", "config", "comm", "ops", "nn", "optim", "zero"},
}
ANYTHING = {"tools", "examples", "bench"}
ROOT_HEADERS = {"error.h"}  # layer 0: every folder may use them
SOURCE = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def self_test():
    """The check fails on an include that runs back up, and passes the same tree without it."""
    import tempfile
    with tempfile.TemporaryDirectory() as t:
        os.makedirs(os.path.join(t, "zero"))
        os.makedirs(os.path.join(t, "runtime"))
        bad = os.path.join(t, "zero", "x.cpp")
        with open(bad, "w") as f:
            f.write('#include "dscpp/comm/process_group.h"\n#include "dscpp/runtime/engine/engine.h"\n')
        fails = run(t, False)
        with open(bad, "w") as f:
            f.write('#include "dscpp/comm/process_group.h"\n')
        passes = run(t, False)
    ok = fails == 1 and passes == 0
    print("self-test:", "the check fails where it should" if ok else "BROKEN")
    return 0 if ok else 1


def main():
    if "--self-test" in sys.argv:
        return self_test()
    return run(sys.argv[1], "--list" in sys.argv)


def run(root, listing):
    listing = "--list" in sys.argv
    bad, cross = [], []
    for top in sorted(set(MAY_USE) | ANYTHING | {"launcher"}):
        base = os.path.join(root, top)
        for dirpath, _, names in os.walk(base):
            for name in sorted(names):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(2)
                        where = f"{rel}:{n}: {target}"
                        if top == "launcher":
                            if target.startswith(("torch/", "ATen/", "c10/", "dscpp/")):
                                bad.append(f"{where} (the launcher uses no LibTorch and no library layer)")
                            continue
                        parts = target.split("/")
                        if parts[0] in MAY_USE or parts[0] in ("runtime", "zero"):
                            bad.append(f"{where} (spell it \"dscpp/{target}\")")
                            continue
                        if parts[0] != "dscpp" or len(parts) < 2:
                            continue
                        if len(parts) == 2:  # a root header
                            if parts[1] not in ROOT_HEADERS and top not in ANYTHING:
                                bad.append(f"{where} (only tools, examples and bench include the umbrella)")
                            continue
                        used = parts[1]
                        if used == top:
                            continue
                        cross.append(f"{rel} -> {used}/")
                        if top in ANYTHING:
                            continue
                        if used not in MAY_USE:
                            bad.append(f"{where} (no folder '{used}' in the table)")
                        elif used not in MAY_USE[top]:
                            bad.append(f"{where} ({top}/ may use only: "
                                       f"{', '.join(sorted(MAY_USE[top])) or 'no other folder'})")
    if listing:
        for c in sorted(set(cross)):
            print(c)
    for b in bad:
        print("against the layer table:", b)
    print(f"{len(set(cross))} cross-folder includes checked, {len(bad)} against the table")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
