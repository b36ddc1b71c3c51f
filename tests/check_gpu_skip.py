#!/usr/bin/env python3
"""Every folder of tests marks its tests as skipped where the machine has too few GPUs: a
CMakeLists.txt under tests/ that adds a test calls dscpp_skip_where_gpus_are_too_few() after
its last add_test (tests/CMakeLists.txt says why). A folder without the call would let a
multi-rank test fail, not skip, on a machine with fewer GPUs than its ranks. Fails naming the
file. Usage: check_gpu_skip.py SOURCE_ROOT | --self-test
"""
import os
import re
import sys
import tempfile

CALL = "dscpp_skip_where_gpus_are_too_few()"


def unmarked(root):
    """The CMakeLists.txt under root/tests that add a test after their last call (or without one)."""
    bad = []
    for folder, dirs, files in os.walk(os.path.join(root, "tests")):
        dirs.sort()
        if "CMakeLists.txt" not in files:
            continue
        path = os.path.join(folder, "CMakeLists.txt")
        with open(path) as f:
            # Comments cannot add tests or call anything.
            text = "\n".join(line.split("#", 1)[0] for line in f.read().splitlines())
        adds = [m.start() for m in re.finditer(r"\badd_test\s*\(", text)]
        if not adds:
            continue
        calls = [m.start() for m in re.finditer(re.escape(CALL), text)]
        if not calls or calls[-1] < adds[-1]:
            bad.append(os.path.relpath(path, root))
    return bad


def self_test():
    with tempfile.TemporaryDirectory() as root:
        good = os.path.join(root, "tests", "good")
        bad = os.path.join(root, "tests", "bad")
        os.makedirs(good)
        os.makedirs(bad)
        with open(os.path.join(good, "CMakeLists.txt"), "w") as f:
            f.write(f"add_test(NAME a COMMAND true)\n{CALL}\n")
        with open(os.path.join(bad, "CMakeLists.txt"), "w") as f:
            f.write(f"{CALL}\nadd_test(NAME b COMMAND true)\n# {CALL}\n")
        found = unmarked(root)
        if found != [os.path.join("tests", "bad", "CMakeLists.txt")]:
            print(f"FAIL: the check found {found}, expected only tests/bad/CMakeLists.txt")
            return 1
    print("PASS: a folder whose last add_test follows its call is reported, a marked one is not")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    bad = unmarked(sys.argv[1])
    for path in bad:
        print(f"FAIL: {path} adds a test after its last {CALL} (or has none): end the file with it")
    if not bad:
        print(f"PASS: every folder of tests ends with {CALL}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
