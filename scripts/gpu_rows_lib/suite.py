"""The `suite` row: the CUDA build with its tests (g++, warnings as errors) and ctest under
the call's deadline, reported as counts (ran, passed, failed, skipped, not reached) and the
names of what failed, from ctest's per-test lines (which exist even when the deadline stops it)."""
import os
import re
import subprocess
import time

from . import machine

# "  12/614 Test  #12: zero.Stage3Relay.X ......***Failed    1.23 sec"
TEST_LINE = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*(?:\*\*\*)?(.+?)\s+[\d.]+ sec\s*$", re.M)


def parse_ctest(text):
    """{'passed': [names], 'failed': [(name, status)], 'skipped': [names], 'not_built': [names]}
    from ctest's output ("Not Run": its executable was not built, e.g. stopped by the deadline)."""
    out = {"passed": [], "failed": [], "skipped": [], "not_built": []}
    for m in TEST_LINE.finditer(text):
        name, status = m.group(1), m.group(2).strip()
        if status.startswith("Passed"):
            out["passed"].append(name)
        elif status.startswith("Skipped") or status.startswith("Not Run (Disabled)"):
            out["skipped"].append(name)
        elif status.startswith("Not Run"):
            out["not_built"].append(name)
        else:
            out["failed"].append((name, status[:60]))
    return out


def count_tests(build, env, exclude=None):
    args = ["ctest", "-N"] + (["-E", exclude] if exclude else [])
    r = subprocess.run(args, cwd=build, env=env, capture_output=True, text=True)
    m = re.search(r"Total Tests: (\d+)", r.stdout)
    return int(m.group(1)) if m else None


def run(root, deps, env, gpus, deadline, logdir, werror=True, cmake_args=()):
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
        lines.append(f"suite: the build was stopped by the deadline after {time.monotonic() - t0:.0f} s: "
                     f"ctest runs what was built")
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
    exclude = machine.CTEST_EXCLUDE
    what = "DeepSpeed comparisons"
    return lines + run_ctest(os.path.join(root, machine.SUITE_BUILD), env, exclude, what, deadline, logdir)


def run_ctest(build, env, exclude, what, deadline, logdir):
    """ctest in BUILD without the tests EXCLUDE matches (WHAT says which), until DEADLINE: the
    report's lines; its output in logdir/ctest.log."""
    ctest_log = os.path.join(logdir, "ctest.log")
    lines = []
    total_all = count_tests(build, env)
    total = count_tests(build, env, exclude)
    left = deadline - time.monotonic() - 5
    if total is None:
        return lines + ["suite: ctest -N found no tests (see ctest.log)"]
    if left < 30:
        return lines + [f"suite: ctest not started: {left:.0f} s left before the deadline"]
    # --stop-time: ctest starts no test after it and still writes its summary; the time of day
    # it takes would wrap at midnight, where only the timeout around ctest stops it.
    stop_at = time.localtime(time.time() + left - 15)
    stop = ["--stop-time", time.strftime("%H:%M:%S", stop_at)] if stop_at.tm_mday == time.localtime().tm_mday else []
    args = ["ctest", "--output-on-failure", "-j", str(min(8, os.cpu_count() or 8)), "--timeout", "300",
            *stop, "-E", exclude, "--output-junit", os.path.join(logdir, "ctest.junit.xml")]
    rc = machine.run_logged(args, build, env, ctest_log, left)
    with open(ctest_log, errors="replace") as f:
        res = parse_ctest(f.read())
    ran = len(res["passed"]) + len(res["failed"]) + len(res["skipped"]) + len(res["not_built"])
    lines.append(f"suite: ctest: {total} tests here ({(total_all or total) - total} excluded on this machine: "
                 f"{what}); ran {ran}, "
                 f"passed {len(res['passed'])}, failed {len(res['failed'])}, skipped {len(res['skipped'])}, "
                 f"not run for want of their executable {len(res['not_built'])}, "
                 f"not reached before the deadline {total - ran}"
                 + (" (ctest stopped by the deadline)" if rc == 124 else ""))
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
