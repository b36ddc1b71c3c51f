#!/usr/bin/env python3
"""No two tests may give the same fixed rendezvous port: ctest runs them side by side (-j2), and
two jobs serving one port fail at random. Fails naming both tests.

A test's ranks get `--master_port 0` (dscpp picks a free port and holds it, docs/launcher.md) or,
from a Python oracle, tests/dscpp_test_ports.py's free_port(); a fixed port is left only where
the job needs one (several launchers forming one job). This check reads every add_test of the
tests' CMakeLists.txt (--master_port N, --port N, --port-base N) and every shell script under
tests/ (--master_port N); 0 and ports from variables are not fixed. An add_test whose name comes
from a loop variable makes one test per value, all sharing a literal port: that fails too.
Usage: check_ports.py SOURCE_ROOT | --self-test
"""
import os
import re
import sys

PORT = re.compile(r"--(?:master_port|port|port-base)[= ]+(\d+)\b")
SCRIPT_PORT = re.compile(r"--master_port[= ]+(\d+)\b")


def add_tests(text):
    """(name, command text, line) of each add_test( ... ) call, parentheses balanced."""
    for m in re.finditer(r"\badd_test\s*\(", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        body = text[m.end():i - 1]
        name = re.search(r"\bNAME\s+(\S+)", body)
        yield (name.group(1) if name else "?"), body, text.count("\n", 0, m.start()) + 1


def fixed_ports(root):
    """port -> [(who, where)] for every fixed port of the tests under root."""
    found = {}
    for folder, dirs, files in os.walk(os.path.join(root, "tests")):
        dirs.sort()
        for f in sorted(files):
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, root)
            if f == "CMakeLists.txt":
                with open(path) as fh:
                    text = "\n".join(line.split("#", 1)[0] for line in fh.read().split("\n"))
                for name, body, line in add_tests(text):
                    for p in PORT.findall(body):
                        if int(p):
                            who = f"test {name}" + (" (each test of its loop)" if "${" in name else "")
                            found.setdefault(int(p), []).append((who, f"{rel}:{line}"))
            elif f.endswith(".sh"):
                with open(path) as fh:
                    for n, line in enumerate(fh, 1):
                        if line.lstrip().startswith("#"):
                            continue
                        for p in SCRIPT_PORT.findall(line):
                            if int(p):
                                found.setdefault(int(p), []).append((f"script {f}", f"{rel}:{n}"))
    return found


def run(root):
    found = fixed_ports(root)
    # A loop's add_test is one test per value of its variable, all on the literal port.
    clashes = {p: who for p, who in sorted(found.items()) if len(who) > 1 or "loop" in who[0][0]}
    for p, who in clashes.items():
        print(f"FAIL: port {p}: " + " and ".join(f"{n} ({w})" for n, w in who))
    if clashes:
        print("give each job --master_port 0 (a free port) or a free_port() (tests/dscpp_test_ports.py)")
        return 1
    print(f"PASS: {len(found)} fixed port(s), each used by one test: "
          + ", ".join(f"{p} ({who[0][0]})" for p, who in sorted(found.items())))
    return 0


def self_test():
    """The check fails on two tests of one port and on a loop over one, names both, and passes
    the same tree with port 0 and a second port."""
    import tempfile
    results = []
    with tempfile.TemporaryDirectory() as t:
        os.makedirs(os.path.join(t, "tests", "a"))
        os.makedirs(os.path.join(t, "tests", "b"))

        def write(path, text):
            with open(os.path.join(t, "tests", path), "w") as f:
                f.write(text)

        def outcome():
            import contextlib
            import io
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = run(t)
            return code, out.getvalue()

        write("a/CMakeLists.txt", "add_test(NAME a.One\n  COMMAND dscpp --num_gpus 2 --master_port 29611 x)\n"
                                  "add_test(NAME a.Zero COMMAND dscpp --master_port 0 x)\n")
        write("b/CMakeLists.txt", "# --master_port 29611 in a comment is no test\n"
                                  "add_test(NAME b.Two COMMAND python o.py --port 29611)\n")
        code, out = outcome()
        results.append(code == 1 and "port 29611: test a.One" in out and "test b.Two" in out)
        write("b/CMakeLists.txt", "add_test(NAME b.Two COMMAND python o.py --port 29612)\n")
        write("b/job.sh", "dscpp --master_port 29612 \"$@\"\n")
        code, out = outcome()
        results.append(code == 1 and "test b.Two" in out and "script job.sh" in out)
        write("b/job.sh", "dscpp --master_port 29613 \"$@\"\n")
        results.append(outcome()[0] == 0)
        write("b/CMakeLists.txt", "foreach(n 2 4)\n  add_test(NAME b.${n} COMMAND dscpp --master_port 29614 x)\n"
                                  "endforeach()\n")
        code, out = outcome()
        results.append(code == 1 and "port 29614: test b.${n} (each test of its loop)" in out)
    ok = all(results)
    print("self-test:", "the check fails where it should" if ok else f"BROKEN {results}")
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    return run(sys.argv[1])


if __name__ == "__main__":
    sys.exit(main())
