#!/usr/bin/env python3
"""scripts/gpu_rows.py --dry-run on the CPU machine: bench/rows.toml parses, every row's files,
programs, executables and references exist and its command lines are well-formed; the rows
the docs cite are defined; and a bad rows file is refused, naming the row and the key.

    gpu_rows_check.py   (exit 0: every check passed; the failures are printed)"""
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.path.join(ROOT, "scripts", "gpu_rows.py")
# The rows the docs and the GPU calls name.
CITED = """gpt1b3-dscpp-z0 gpt1b3-dscpp-z1 gpt1b3-dscpp-z2 gpt1b3-dscpp-z3 gpt1b3-ds-z0 gpt1b3-ds-z1 gpt1b3-ds-z2
gpt1b3-ds-z2-fusedadam gpt1b3-ds-z3 gpt1b3-pt-eager gpt1b3-pt-compile gpt6b7-dscpp-z2 gpt6b7-dscpp-z3 gpt6b7-ds-z2
gpt6b7-ds-z3 moe1gpu-dscpp moe1gpu-pt-compile offload4b6-dscpp offload4b6-ds offload9b-dscpp offload7b5-dscpp-both
cpuadam-dscpp cpuadam-ds kernels pipe-bubble suite""".split()

failures = []


def run(*args):
    r = subprocess.run([sys.executable, RUNNER, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def check(cond, what, output=""):
    if not cond:
        failures.append(what + ("\n" + output[-3000:] if output else ""))


def bad_rows(text):
    """gpu_rows.py --dry-run over a rows file holding TEXT: (rc, output)."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    try:
        return run("--dry-run", "--rows", f.name)
    finally:
        os.unlink(f.name)


GOOD = """
[rows.a]
system = "dscpp"
model = "bench/configs/gpt_1.3B_bench.json"
ds_config = "ds_configs/gpt_bf16_zero2.json"
steps = 10
warmup = 10
expect_s = 40
"""


def check_ctest_report():
    """The suite's ctest step over a project of four tests: one excluded, then one of each outcome."""
    from gpu_rows_lib.suite import run_ctest
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.20)\nproject(t NONE)\nenable_testing()\n"
                    "add_test(NAME a.Passes COMMAND true)\nadd_test(NAME a.Fails COMMAND false)\n"
                    "add_test(NAME a.Skips COMMAND sh -c \"exit 77\")\n"
                    "set_tests_properties(a.Skips PROPERTIES SKIP_RETURN_CODE 77)\n"
                    "add_test(NAME a.AgreesWithDeepSpeed COMMAND true)\n")
        build = os.path.join(d, "build")
        r = subprocess.run(["cmake", "-S", d, "-B", build], capture_output=True, text=True)
        check(r.returncode == 0, "cmake of the four-test project failed", r.stdout + r.stderr)
        logs = os.path.join(d, "logs")
        os.makedirs(logs)
        lines = run_ctest(build, dict(os.environ), "DeepSpeed", "DeepSpeed comparisons", time.monotonic() + 120, logs, d)
        text = "\n".join(lines)
        check("3 tests here (1 excluded on this machine: DeepSpeed comparisons)" in text
              and "this call ran 3 of the 3 left: passed 1, failed 1, skipped 1, not run for want of their executable 0, "
              "not reached before the deadline 0" in text
              and "failed: a.Fails (Failed)" in text and "skipped: a.Skips" in text, "the suite's ctest report", text)
        # Called again over the same build, it runs only what neither passed nor skipped.
        text = "\n".join(run_ctest(build, dict(os.environ), "DeepSpeed", "DeepSpeed comparisons",
                                    time.monotonic() + 120, logs, d))
        check("1 passed and 1 skipped in an earlier call" in text and "this call ran 1 of the 1 left: passed 0, failed 1"
              in text, "the suite's second ctest call did not go on from the first", text)


def main():
    # Every row of the real table, dry.
    rc, out = run("--dry-run")
    check(rc == 0 and "well-formed" in out, f"--dry-run over bench/rows.toml: rc={rc}", out)
    listed = re.findall(r"^## (\S+) \(", out, re.M)
    rc2, names = run("--list")
    defined = [l.split()[0] for l in names.splitlines()[1:] if l.strip()]
    check(rc2 == 0 and sorted(listed) == sorted(defined), "--dry-run did not print every row of --list", out)
    for name in CITED:
        check(name in defined, f"row '{name}' (named in the docs) is not in bench/rows.toml")
    # Each dscpp row runs train_gpt through the launcher from the build folder, on the corpus.
    for m in re.finditer(r"^## (\S+) \(train, dscpp.*\n(?:   (?:targets|writes).*\n)*   (.*)$", out, re.M):
        check("build-cuda/launcher/dscpp --num_gpus" in m.group(2) and "build-cuda/examples/train_gpt" in m.group(2)
              and "--train-data-path .gpu/corpus/fortunes_text_document" in m.group(2),
              f"row {m.group(1)}: not a train_gpt command line: {m.group(2)}")
    # The suite runs last, and a row stands next to its reference.
    rc, out = run("--dry-run", "gpt1b3-dscpp-z2-fusedln", "suite", "kernels", "gpt1b3-dscpp-z2")
    order = re.findall(r"^## (\S+) \(", out, re.M)
    check(order == ["gpt1b3-dscpp-z2", "gpt1b3-dscpp-z2-fusedln", "kernels", "suite"],
          f"order of asked rows: {order}", out)
    # The twin model configs are overrides: the derived config says what the row changes.
    check("writes " in out and "model.json" in out, "gpt1b3-dscpp-z2-fusedln writes no model.json", out)
    rc, out = run("--dry-run", "no-such-row")
    check(rc == 2 and "no row 'no-such-row'" in out, f"an unknown row: rc={rc}", out)

    # Bad rows files are refused with the row and the key named.
    check(bad_rows(GOOD)[0] == 0, "the good sample row was refused", bad_rows(GOOD)[1])
    cases = [
        (GOOD.replace("gpt_1.3B_bench.json", "no_such_model.json"), r"rows\.a: model: no such file 'bench/configs/no_such_model.json'"),
        (GOOD + 'reference = "b"\n', r"rows\.a: reference: no row 'b'"),
        (GOOD.replace("warmup = 10", "warmup = 5"), r"rows\.a: warmup: .*multiple of steps"),
        (GOOD + "stesp = 3\n", r"rows\.a: stesp: not a row key"),
        (GOOD.replace('"dscpp"', '"dscp"'), r"rows\.a: system: expected one of"),
        (GOOD.replace("expect_s = 40\n", ""), r"rows\.a: expect_s"),
        ('[rows.p]\nkind = "program"\ncommands = [["{bin}/bench/no_such_bench"]]\nexpect_s = 5\n',
         r"rows\.p: commands: no executable builds as 'bench/no_such_bench'"),
        ('[rows.p]\nkind = "program"\ncommands = [["{bin}/bench/kernels_bench"]]\nexpect_s = 5\n',
         r"rows\.p: commands: '\{bin\}/bench/kernels_bench' is target kernels_bench, not in targets"),
        ('[rows.p]\nkind = "program"\ncommands = [["{py}", "bench/no_such.py"]]\nexpect_s = 5\n',
         r"rows\.p: commands: no such file 'bench/no_such.py'"),
        ("[rows.a\n", r"rows"),
    ]
    for text, want in cases:
        rc, out = bad_rows(text)
        check(rc == 2 and re.search(want, out), f"bad row not refused as /{want}/ (rc={rc})", out)
    # The suite's counts from ctest's per-test lines (the deadline may stop ctest before its summary).
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from gpu_rows_lib.suite import parse_ctest
    transcript = """      Start  1: a.Passes
 1/6 Test  #1: a.Passes .........................   Passed    0.01 sec
 2/6 Test  #2: a.Regex ..........................***Failed  Required regular expression not found. Regex=[x]  0.10 sec
 3/6 Test  #3: a.Skips ..........................***Skipped   0.00 sec
 4/6 Test  #4: a_NOT_BUILT ......................***Not Run   0.00 sec
 5/6 Test  #5: a.Crashes ........................***Exception: SegFault  0.20 sec
 6/7 Test  #6: a.Slow ...........................***Timeout 300.05 sec
 7/7 Test  #7: a.CutByTheDeadline ...............***Timeout   3.31 sec
"""
    got = parse_ctest(transcript, timeout=300)
    check(got["passed"] == ["a.Passes"] and got["skipped"] == ["a.Skips"] and got["not_built"] == ["a_NOT_BUILT"]
          and [n for n, _ in got["failed"]] == ["a.Regex", "a.Crashes", "a.Slow"]
          and got["stopped"] == ["a.CutByTheDeadline"], f"parse_ctest: {got}")
    check_ctest_report()
    if failures:
        print("\n\n".join(failures))
        return 1
    print(f"gpu_rows: {len(defined)} rows dry-run clean; {len(cases)} bad rows files refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
