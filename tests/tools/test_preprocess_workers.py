"""preprocess_data --workers: a count that is no count is refused (exit 2, naming the flag and
the range), a count above the CPUs this process may run on is capped there with a line saying
so, and the capped run writes the same bytes as one worker (the output does not depend on the
number of workers)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

FAILED = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name)
    if not ok:
        FAILED.append(name)
        print(detail[-3000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--bpe-dir", required=True)
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.json")
        with open(corpus, "w") as f:
            for i in range(200):
                f.write(json.dumps({"text": f"document {i}: the quick brown fox, {i * 7} times."}) + "\n")

        def run(workers, prefix):
            return subprocess.run(
                [args.tool, "--input", corpus, "--output-prefix", os.path.join(tmp, prefix),
                 "--vocab-file", os.path.join(args.bpe_dir, "encoder.json"),
                 "--merge-file", os.path.join(args.bpe_dir, "vocab.bpe"), "--workers", str(workers)],
                capture_output=True, text=True, timeout=120)

        for bad in ["0", "-3", "100000", "2147483647"]:
            p = run(bad, "bad")
            check(f"--workers {bad} is refused with exit 2", p.returncode == 2, p.stderr)
            check(f"--workers {bad}: the message names the flag and the range",
                  f"--workers {bad}: expected a count of tokenising threads from 1 to 65536" in p.stderr, p.stderr)
            check(f"--workers {bad}: nothing written", not os.path.exists(os.path.join(tmp, "bad_text_document.bin")))
        for bad in ["many", "1e9", "99999999999"]:
            p = run(bad, "bad")
            check(f"--workers {bad} (not an int) is a usage error", p.returncode == 2 and "workers" in p.stderr,
                  p.stderr)

        one = run(1, "one")
        check("--workers 1 succeeds", one.returncode == 0, one.stderr)
        capped = run(20000, "capped")
        check("--workers 20000 succeeds", capped.returncode == 0, capped.stderr)
        s = "" if cpus == 1 else "s"
        check("--workers 20000 says it is capped at the CPUs",
              f"--workers 20000 is more than the {cpus} CPU{s} this process may run on: using {cpus}"
              in capped.stderr, capped.stderr)
        check("the capped run reports the workers it used",
              f"{cpus} worker{s} (start-up" in capped.stderr, capped.stderr)
        for ext in ["bin", "idx"]:
            a = open(os.path.join(tmp, f"one_text_document.{ext}"), "rb").read()
            b = open(os.path.join(tmp, f"capped_text_document.{ext}"), "rb").read()
            check(f"the capped run's .{ext} equals one worker's", a == b and len(a) > 0)
    if FAILED:
        print(f"{len(FAILED)} check(s) failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
