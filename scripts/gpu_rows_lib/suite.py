"""The `suite` row: the CUDA build with its tests (g++, warnings as errors) and ctest under
the call's deadline, reported as counts (ran, passed, failed, skipped, not reached) and the
names of what failed, from ctest's per-test lines (which exist even when the deadline stops it)."""
import hashlib
import json
import os
import re
import subprocess
import time

from . import machine

# "  12/614 Test  #12: zero.Stage3Relay.X ......***Failed    1.23 sec"; a name may hold spaces
# (a parameterised gtest's "Suite/Test/(0, 1)"): it ends at the dots.
TEST_LINE = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (.+?) \.+\s*(?:\*\*\*)?(\S.*?)\s+([\d.]+) sec\s*$", re.M)


def parse_ctest(text, timeout=None):
    """{'passed': [names], 'failed': [(name, status)], 'skipped': [names], 'not_built': [names],
    'stopped': [names]} from ctest's output ("Not Run": its executable was not built, e.g.
    stopped by the deadline). A "Timeout" before TIMEOUT (ctest's per-test limit) is ctest's
    --stop-time ending a test that was still running: stopped, neither failed nor done."""
    out = {"passed": [], "failed": [], "skipped": [], "not_built": [], "stopped": []}
    for m in TEST_LINE.finditer(text):
        name, status, secs = m.group(1), m.group(2).strip(), float(m.group(3))
        if status.startswith("Timeout") and timeout is not None and secs < timeout - 1:
            out["stopped"].append(name)
        elif status.startswith("Passed"):
            out["passed"].append(name)
        elif status.startswith("Skipped") or status.startswith("Not Run (Disabled)"):
            out["skipped"].append(name)
        elif status.startswith("Not Run"):
            out["not_built"].append(name)
        else:
            out["failed"].append((name, status[:60]))
    return out


def list_tests(build, env, exclude=None):
    """{name: ctest's number} of the tests ctest -N lists (without those EXCLUDE matches);
    None where ctest lists none."""
    args = ["ctest", "-N"] + (["-E", exclude] if exclude else [])
    r = subprocess.run(args, cwd=build, env=env, capture_output=True, text=True)
    tests = {m.group(2): int(m.group(1)) for m in re.finditer(r"^\s*Test\s+#(\d+): (.+?)\s*$", r.stdout, re.M)}
    return tests or None


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def fingerprint(build, sources, skip=()):
    """What the tests' outcomes depend on: every program BUILD's build made (ELF files: path,
    size, time; not the scripts tests write there), the CTestTestfile.cmake files, and the
    scripts, configs and CMake files under SOURCES (their content; build folders, hidden ones
    and SKIP left out)."""
    entries = []
    for top, hash_content in ((build, False), (sources, True)):
        for dirpath, dirnames, filenames in os.walk(top):  # pruned as it goes
            dirnames[:] = [d for d in dirnames if d not in ("CMakeFiles", "Testing", "__pycache__")
                           and os.path.join(dirpath, d) not in (build, *skip)
                           and not (hash_content and d.startswith((".", "build")))]
            for f in filenames:
                path = os.path.join(dirpath, f)
                if hash_content and f.endswith((".py", ".sh", ".json", ".yaml", ".txt")) or f == "CTestTestfile.cmake":
                    with open(path, "rb") as fh:
                        entries.append(f"{path} {hashlib.sha256(fh.read()).hexdigest()}")
                elif not hash_content and os.path.isfile(path) and os.access(path, os.X_OK) and is_elf(path):
                    st = os.stat(path)
                    entries.append(f"{path} {st.st_size} {st.st_mtime_ns}")
    h = hashlib.sha256()
    for e in sorted(entries):
        h.update(e.encode() + b"\n")
    return h.hexdigest()


def run(root, deps, env, gpus, deadline, logdir, werror=True, cmake_args=(), resume=True):
    """Configures SUITE_BUILD, builds everything and runs ctest until DEADLINE (a time.monotonic() value).
    Returns the report's lines; the logs are logdir/suite_build.log and logdir/ctest.log."""
    build_log = os.path.join(logdir, "suite_build.log")
    lines = []
    t0 = time.monotonic()
    if machine.configure(root, machine.SUITE_BUILD, deps, env, werror, build_log, cmake_args) != 0:
        return [f"suite: the CUDA configure failed (suite_build.log): {tail(build_log, 3)}"]
    rc, failed = machine.ninja(root, machine.SUITE_BUILD, env, [], build_log, deadline - time.monotonic() - 60)
    with open(build_log, errors="replace") as f:
        text = f.read()
    warnings = len(re.findall(r"warning: ", text))
    built = f"built in {time.monotonic() - t0:.0f} s (g++, Release, DSCPP_WERROR={'ON' if werror else 'OFF'})"
    if rc == 124:
        lines.append(f"suite: the build was stopped by the deadline after {time.monotonic() - t0:.0f} s: call "
                     "`suite` again on the warm machine (within 30 s) and the build goes on from there; no ctest "
                     "now (a test run over a partial build counts for nothing once the build goes on)")
    elif failed:
        lines.append(f"suite: {built}; {len(failed)} outputs FAILED to build: {', '.join(failed[:12])}"
                     + (" ..." if len(failed) > 12 else ""))
    else:
        lines.append(f"suite: {built}, every target")
    lines.append(f"suite: {warnings} compiler warnings in suite_build.log")
    # The first distinct diagnostics: g++ warns where clang++ on the CPU machines does not.
    seen = []
    for m in re.finditer(r"^(\S+?):(\d+):\d+: (?:error|warning): (.*)$", text, re.M):
        d = f"{os.path.relpath(m.group(1), root) if os.path.isabs(m.group(1)) else m.group(1)}:{m.group(2)}: {m.group(3)}"
        if d not in seen:
            seen.append(d)
    lines += [f"suite:   {d[:200]}" for d in seen[:8]] + ([f"suite:   ... {len(seen) - 8} more"] if len(seen) > 8 else [])
    if rc == 124:
        return lines
    exclude = machine.CTEST_EXCLUDE
    what = "DeepSpeed comparisons"
    return lines + run_ctest(os.path.join(root, machine.SUITE_BUILD), env, exclude, what, deadline, logdir,
                             root, resume)


def run_ctest(build, env, exclude, what, deadline, logdir, sources, resume=True):
    """ctest in BUILD without the tests EXCLUDE matches (WHAT says which), until DEADLINE: the
    report's lines; its output in logdir/ctest.log. With RESUME, the tests that passed or
    skipped in an earlier call over the same executables and scripts (SOURCES: the source
    tree) are not run again: a suite longer than one call goes on in the next."""
    ctest_log = os.path.join(logdir, "ctest.log")
    lines = []
    all_tests = list_tests(build, env) or {}
    tests = list_tests(build, env, exclude)
    left = deadline - time.monotonic() - 5
    if tests is None:
        return lines + ["suite: ctest -N found no tests (see ctest.log)"]
    state_path = os.path.join(build, "gpu_rows_ctest_state.json")
    fp = fingerprint(build, sources, skip=(os.path.abspath(logdir), os.path.dirname(os.path.abspath(logdir))))
    done = {"passed": [], "skipped": []}
    try:
        with open(state_path) as f:
            state = json.load(f)
        if resume and state.get("fingerprint") == fp:
            done = {k: [n for n in state.get(k, []) if n in tests] for k in done}
    except (OSError, ValueError):
        pass
    earlier = set(done["passed"]) | set(done["skipped"])
    todo = sorted(num for name, num in tests.items() if name not in earlier)
    head = (f"suite: ctest: {len(tests)} tests here ({len(all_tests) - len(tests)} excluded on this machine: {what})"
            + (f"; {len(done['passed'])} passed and {len(done['skipped'])} skipped in an earlier call over the same "
               f"build, not run again" if earlier else ""))
    if not todo:
        return lines + [head + "; nothing left to run"]
    if left < 30:
        return lines + [head, f"suite: ctest not started: {max(left, 0):.0f} s left before the deadline"]
    only = []
    if earlier:
        ids = os.path.join(logdir, "ctest_ids.txt")
        with open(ids, "w") as f:
            f.write("0,0,0," + ",".join(map(str, todo)) + "\n")
        only = ["-I", ids]
    # --stop-time: ctest starts no test after it and still writes its summary; the time of day
    # it takes would wrap at midnight, where only the timeout around ctest stops it.
    stop_at = time.localtime(time.time() + left - 15)
    stop = ["--stop-time", time.strftime("%H:%M:%S", stop_at)] if stop_at.tm_mday == time.localtime().tm_mday else []
    per_test = 300
    args = ["ctest", "--output-on-failure", "-j", str(min(8, os.cpu_count() or 8)), "--timeout", str(per_test),
            *stop, *only, "-E", exclude, "--output-junit", os.path.join(logdir, "ctest.junit.xml")]
    open(ctest_log, "w").close()  # this call's tests only
    rc = machine.run_logged(args, build, env, ctest_log, left)
    with open(ctest_log, errors="replace") as f:
        res = parse_ctest(f.read(), per_test if stop else None)
    ran = len(res["passed"]) + len(res["failed"]) + len(res["skipped"]) + len(res["not_built"])
    with open(state_path, "w") as f:
        json.dump({"fingerprint": fp, "passed": sorted(set(done["passed"]) | set(res["passed"])),
                   "skipped": sorted(set(done["skipped"]) | set(res["skipped"]))}, f)
    lines.append(head)
    lines.append(f"suite: this call ran {ran} of the {len(todo)} left: passed {len(res['passed'])}, "
                 f"failed {len(res['failed'])}, skipped {len(res['skipped'])}, not run for want of their "
                 f"executable {len(res['not_built'])}, not reached before the deadline {len(todo) - ran}"
                 + (f" ({len(res['stopped'])} of them stopped by it while running)" if res["stopped"] else "")
                 + (" (ctest stopped by the deadline)" if rc == 124 else ""))
    if earlier or len(todo) - ran:
        passed = len(done["passed"]) + len(res["passed"])
        lines.append(f"suite: in all {passed} of {len(tests)} passed"
                     + (f"; {len(todo) - ran} not yet run: call `suite` again (it goes on from here)"
                        if len(todo) - ran else ""))
    if res["failed"]:
        lines.append("suite: failed: " + ", ".join(f"{n} ({s})" for n, s in res["failed"]))
    if res["not_built"]:
        lines.append("suite: not built: " + ", ".join(res["not_built"][:20]) + (" ..." if len(res["not_built"]) > 20 else ""))
    if res["skipped"]:
        lines.append("suite: skipped: " + ", ".join(res["skipped"][:20]) + (" ..." if len(res["skipped"]) > 20 else ""))
    return lines


def tail(path, n):
    try:
        with open(path, errors="replace") as f:
            return " / ".join(l.strip() for l in f.read().splitlines()[-n:])
    except OSError:
        return ""
