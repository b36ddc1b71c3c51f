#!/usr/bin/env python3
"""Runs named rows of bench/rows.toml on a GPU machine and prints one table.

usage: scripts/gpu_rows.py ROW [ROW ...] [--deadline S] [--dry-run] [--list] [--targets] [--rows FILE]
                           [--commit C] [--with-refs] [--out DIR] [--bin DIR] [--no-prebuilt]
                           [--werror | --no-werror] [--cmake-arg ARG] [--suite-fresh] [--corpus PREFIX]
                           [--cpu] [--model FILE] [--steps N] [--warmup N]

What one call does, in order:
  1. sets the machine up: unpacks the Debian packages carried in .gpu/*.deb (Boost.Program_options,
     liburing, yaml-cpp, Gloo's headers) into /opt/deps; installs DeepSpeed (and torchao) from
     .gpu/ds-wheels into /opt/dspy only when a row asked for (or the suite) imports it, and JIT-builds the DeepSpeed ops those
     rows load (FusedAdam, DeepSpeedCPUAdam) in the background;
  2. gets the executables the rows need: scripts/gpu_prebuild.sh's pack (.gpu/prebuilt) when its
     source hashes match this tree and it holds them (built with clang++: the table says so),
     else a Release build of the CUDA variant here with g++ (build-cuda/, only those targets);
  3. runs the rows, each next to its reference rows, each under a time limit; a row whose
     expect_s does not fit before --deadline is not started, and the table says so; a row that
     needs more GPU memory (needs_gib) or host memory than the machine has is skipped saying why,
     or its `smaller` row runs in its place; `suite` (the CUDA build with its tests, warnings as
     errors, then ctest until the deadline) runs last; called again on the warm machine, it goes
     on where the last call stopped (the build, and the tests not yet passed or skipped);
  4. prints ONE table: row, tokens/s, TFLOP/s, MFU (against the card's dense bf16 peak: 989 for
     an H100 SXM or an H200), peak GPU memory, ratio to its reference rows (when they ran in this
     call), wall time, note; the card, date and commit above it; the suite's counts below it.
     $OUT (else ./gpu-out) gets table.md, rows.json and logs.tgz (every log: a device call returns
     at most 8 files).

The commit: --commit, else the file .gpu/commit, else `git rev-parse` where the tree has .git
(the device machine's copy may carry an older .git: scripts/gpu_prebuild.sh writes .gpu/commit;
or `git rev-parse --short HEAD > .gpu/commit` before the
call), else "unknown".

Before a device call: python3 scripts/gpu_rows.py --dry-run ROW ... (on the CPU machine: checks
the rows and prints their command lines); carry .gpu (the .debs, ds-wheels, corpus/ with
fortunes_text_document.{bin,idx} from scripts/prepare_corpus.sh .gpu/corpus, and prebuilt/).
A device command line, e.g.:
  python3 scripts/gpu_rows.py --deadline 560 gpt1b3-dscpp-z2 gpt1b3-ds-z2 gpt1b3-pt-compile

When a machine does not start (a refused or failed start):
  - do not call again before the minutes the refusal names: each refused or failed try costs
    1-2 minutes of device time and starts nothing;
  - do the CPU work in between (the next change, --dry-run of the next call's rows,
    scripts/gpu_prebuild.sh so that the next call does not build);
  - put everything a piece of work needs from the GPU into one or two calls, prepared before
    the first (rows chosen, --dry-run passed, .gpu/ complete): a fresh machine costs minutes
    to start and build on;
  - on a warm machine the next call must follow within 30 s, or the machine goes back: have
    the next command ready before the current one ends.

Smoke runs on a CPU machine (no GPU): --cpu --bin build (a CPU build's executables) --model
model_zoo/configs/gpt_tiny.json --steps 1 --warmup 1 --corpus PREFIX run the rows' command lines
with a tiny model instead of theirs, on CPU ranks."""
import argparse
import datetime
import difflib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_rows_lib import machine, measure, rows as rowlib, suite  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = ".gpu/corpus/fortunes_text_document"
RESERVE_S = 15  # kept at the end for the table and the logs' archive
PORT_BASE = 29800


def parse_args(argv):
    title, usage, rest = __doc__.split("\n\n", 2)
    ap = argparse.ArgumentParser(usage=usage.removeprefix("usage: "), description=title + "\n\n" + rest,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="*", metavar="ROW", help="rows of the rows file (--list names them)")
    ap.add_argument("--rows", dest="rows_file", default=os.path.join(ROOT, "bench", "rows.toml"),
                    help="the rows file (default bench/rows.toml)")
    ap.add_argument("--deadline", type=float, default=570.0,
                    help="seconds from the start by which the table is printed (default 570: a 600 s call)")
    ap.add_argument("--list", action="store_true", help="list the rows and exit")
    ap.add_argument("--targets", action="store_true",
                    help="print the CMake targets the rows need (every row without ROW) and exit")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the rows (every row without ROW) and print their command lines; runs nothing")
    ap.add_argument("--commit", help="the commit the tree is (where it has no .git)")
    ap.add_argument("--with-refs", action="store_true", help="run each row's reference rows too")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "gpu-out"),
                    help="logs and the table (default $OUT, else ./gpu-out)")
    ap.add_argument("--bin", help="use the executables under this build folder (no set-up, no build)")
    ap.add_argument("--no-prebuilt", action="store_true", help="build here even if .gpu/prebuilt matches")
    ap.add_argument("--werror", dest="werror", action="store_true", default=None,
                    help="build with -DDSCPP_WERROR=ON (the default when `suite` is asked for)")
    ap.add_argument("--no-werror", dest="werror", action="store_false", help="build with -DDSCPP_WERROR=OFF")
    ap.add_argument("--cmake-arg", action="append", default=[], help="one more CMake argument (repeatable)")
    ap.add_argument("--suite-fresh", action="store_true",
                    help="suite: run every test, also those that passed in an earlier call over the same build")
    ap.add_argument("--corpus", default=CORPUS, help=f"the indexed dataset prefix (default {CORPUS})")
    ap.add_argument("--cpu", action="store_true",
                    help="smoke run without a GPU: the rows' GPU and memory needs are not checked")
    ap.add_argument("--model", help="smoke run: this model config for every train row")
    ap.add_argument("--steps", type=int, help="smoke run: timed steps of every train row")
    ap.add_argument("--warmup", type=int, help="smoke run: warm-up steps of every train row")
    return ap.parse_args(argv)


def order(names, rows):
    """The asked rows, each next to its references: groups linked by references (in any
    direction), in the order their first row was asked for; within a group, references first."""
    parent = {n: n for n in names}

    def find(n):
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n
    for n in names:
        for ref in rowlib.references(rows[n]):
            if ref in parent:
                parent[find(n)] = find(ref)
    groups = {}
    for n in names:
        groups.setdefault(find(n), []).append(n)
    out = []
    for members in groups.values():
        placed = []

        def place(n, seen=()):
            if n in placed or n in seen:
                return
            for ref in rowlib.references(rows[n]):
                if ref in members:
                    place(ref, seen + (n,))
            placed.append(n)
        for n in members:
            place(n)
        out += placed
    # The suite last: the rows' figures come back even if the deadline cuts it.
    return [n for n in out if rows[n].get("kind") != "suite"] + [n for n in out if rows[n].get("kind") == "suite"]


def resolve(args, rows):
    unknown = [n for n in args.rows if n not in rows]
    if unknown:
        for n in unknown:
            close = difflib.get_close_matches(n, rows, n=3)
            print(f"gpu_rows: no row '{n}'" + (f" (did you mean {', '.join(close)}?)" if close else ""),
                  file=sys.stderr)
        sys.exit(2)
    names = list(dict.fromkeys(args.rows))
    if args.with_refs:  # the asked rows' own references, not theirs in turn
        for n in list(names):
            names += [r for r in rowlib.references(rows[n]) if r not in names]
    return order(names, rows)


def list_rows(rows):
    print(f"{'row':32} {'what':16} {'gpus':>4} {'GiB':>5} {'s':>4}  description")
    for name, r in rows.items():
        kind = r.get("kind", "train")
        what = r["system"] if kind == "train" else kind
        print(f"{name:32} {what:16} {r.get('gpus', 1) if kind != 'suite' else '':>4} "
              f"{r.get('needs_gib', ''):>5} {r['expect_s']:>4.0f}  {r.get('description', '')}")


def context(args, name, index, bindir, nproc):
    ctx = {"bin": bindir, "py": sys.executable if not args.dry_run else "python3", "nproc": nproc,
           "work": os.path.join(args.out, "logs", name), "port": PORT_BASE + index, "corpus": args.corpus,
           "root": ROOT, "model": args.model, "steps": args.steps, "warmup": args.warmup}
    return ctx


def dry_run(args, rows, names):
    """Prints each row's command lines; checks what a CPU machine can: every file a command
    names that is not built or written by the run exists."""
    bad = 0
    for i, name in enumerate(names):
        row = rows[name]
        kind = row.get("kind", "train")
        print(f"## {name} ({kind}{', ' + row['system'] if kind == 'train' else ''}; expect {row['expect_s']:.0f} s"
              + (f"; needs {row['needs_gib']} GiB" if "needs_gib" in row else "")
              + (f"; reference {', '.join(rowlib.references(row))}" if "reference" in row else "") + ")")
        if kind == "suite":
            print(f"   configure {machine.SUITE_BUILD} (g++, Release, DSCPP_WERROR=ON), ninja (all), ctest -E '"
                  + machine.CTEST_EXCLUDE + "' under the deadline")
            continue
        plan = rowlib.commands(row, context(args, name, i, machine.BUILD, "$(nproc)"))
        targets = rowlib.targets_of(row)
        if targets:
            print(f"   targets: {' '.join(targets)}")
        for path in plan["files"]:
            print(f"   writes {os.path.relpath(path, ROOT)}")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan["env"].items())
        for cmd in plan["cmds"]:
            print("   " + (env + " " if env else "") + shlex.join(cmd))
            for arg in cmd:
                problem = check_arg(arg, plan, args)
                if problem:
                    print(f"   ERROR: {problem}")
                    bad += 1
    total = sum(rows[n]["expect_s"] for n in names)
    needs_build = any(rowlib.targets_of(rows[n]) for n in names)
    print(f"gpu_rows: dry run of {len(names)} rows: " + (f"{bad} problems" if bad else "well-formed")
          + f"; they expect {total:.0f} s" + (" (plus the build: ~150 s without a matching .gpu/prebuilt)"
                                              if needs_build else ""))
    return 1 if bad else 0


def check_arg(arg, plan, args):
    """A problem with one argument of a command line, or None."""
    if arg == "":
        return "an empty argument"
    if "{" in arg and "}" in arg:
        return f"a placeholder left in '{arg}'"
    looks_like_file = arg.endswith((".py", ".json", ".yaml")) and not arg.startswith("-")
    written = arg in plan["files"] or arg.startswith(os.path.join(args.out, "logs"))
    if looks_like_file and not written and not os.path.isfile(os.path.join(ROOT, arg)):
        return f"no such file '{arg}'"
    return None


def commit_of(args):
    if args.commit:
        return args.commit
    # Before git: the device machine's copy of the tree may carry an older .git than the tree.
    try:
        with open(os.path.join(ROOT, ".gpu", "commit")) as f:
            return f.read().strip() + " (from .gpu/commit)"
    except OSError:
        pass
    if os.path.exists(os.path.join(ROOT, ".git")):
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode == 0:
            dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT).returncode != 0
            return r.stdout.strip() + (" with uncommitted changes" if dirty else "")
    return "unknown (pass --commit)"


class Run:
    """One call: the set-up, the rows in order under the deadline, the table."""

    def __init__(self, args, rows, names):
        self.args, self.rows, self.names = args, rows, names
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.deadline
        self.logdir = os.path.join(args.out, "logs")
        self.entries = []
        self.suite_lines = []
        self.notes = []
        self.env = machine.base_env(ROOT)

    def left(self):
        return self.deadline - time.monotonic() - RESERVE_S

    def say(self, text):
        print(f"gpu_rows [{time.monotonic() - self.t0:4.0f} s] {text}", flush=True)

    def skip(self, name, why):
        self.entries.append({"name": name, "status": f"not run: {why}", "res": None, "at": self.position(name)})
        self.say(f"{name}: not run: {why}")

    def setup(self):
        """Everything before the first row; returns the rows that can run."""
        os.makedirs(self.logdir, exist_ok=True)
        setup_log = open(os.path.join(self.logdir, "setup.log"), "a")
        self.info = machine.card_info(self.env)
        self.host = machine.host_gib()
        self.say(f"{self.info['gpus']} x {self.info['card']} ({self.info['gib']:.1f} GiB), host {self.host:.0f} GiB, "
                 f"{os.cpu_count()} cores")
        runnable = []
        for name in self.names:
            name, why, instead = self.fit(name)
            if why:
                self.skip(name, why)
            else:
                runnable.append((name, instead))
        need_ds = [n for n, _ in runnable if rowlib.needs_deepspeed(self.rows[n])]
        deps = None
        if not self.args.bin:
            deps = machine.unpack_debs(ROOT, self.env, setup_log)
            lacking = machine.missing_packages(deps)
            if lacking:
                self.say(f"WARNING: not in .gpu/*.deb nor on this machine: {', '.join(lacking)} (a build here fails)")
        self.deps = deps
        self.ds_why = machine.install_deepspeed(ROOT, self.env, setup_log) if need_ds else None
        ops = sorted({op for n, _ in runnable for op in rowlib.ds_ops_of(self.rows[n], ROOT)})
        self.ops = None
        if ops and not self.ds_why:
            self.say(f"building DeepSpeed's {', '.join(ops)} in the background")
            self.ops = machine.start_ds_ops(ops, self.env, os.path.join(self.logdir, "ds_ops_build.log"))
        targets = sorted({t for n, _ in runnable for t in rowlib.targets_of(self.rows[n])})
        self.bindir, self.binaries = self.executables(targets, setup_log)
        setup_log.close()
        return runnable

    def fit(self, name):
        """(row to run, why not, the row it stands in for): a row that does not fit this machine
        gives way to its `smaller` row, and that one to its own, while one is defined."""
        row, whys = self.rows[name], []
        while True:
            why = self.misfit(row)
            if not why:
                break
            whys.append(f"{row['name']} {why}" if row["name"] != name else why)
            if "smaller" not in row or row["smaller"] == name or len(whys) > len(self.rows):
                return name, "; ".join(whys), None
            row = self.rows[row["smaller"]]
        if row["name"] == name:
            return name, None, None
        if row["name"] in self.names:
            return name, f"{whys[0]}; its smaller row {row['name']} is asked for already", None
        self.say(f"{name}: {whys[0]}: its smaller row {row['name']} runs instead")
        return row["name"], None, name

    def misfit(self, row):
        if row.get("kind") == "suite" or self.args.cpu:
            return None
        gpus = row.get("gpus", 1)
        if self.info["gpus"] < gpus:
            return f"needs {gpus} GPUs, {self.info['gpus']} here"
        if gpus and row.get("needs_gib", 0) > self.info["gib"] + 0.5:
            return f"needs {row['needs_gib']} GiB of GPU memory, {self.info['gib']:.0f} here ({self.info['card']})"
        if row.get("needs_host_gib", 0) > self.host + 0.5:
            return f"needs {row['needs_host_gib']} GiB of host memory, {self.host:.0f} here"
        uses_corpus = (row.get("kind", "train") == "train" and row["system"] == "dscpp"
                       or row.get("program") == "bench/pytorch_moe_gpt.py"
                       or any("{corpus}" in a for c in row.get("commands", []) for a in c))
        if uses_corpus and not os.path.isfile(os.path.join(ROOT, self.args.corpus + ".idx")):
            return (f"no corpus at {self.args.corpus}.idx (carry .gpu/corpus: scripts/prepare_corpus.sh "
                    ".gpu/corpus on the CPU machine)")
        return None

    def executables(self, targets, log):
        """(the folder the rows' {bin} is, what built it)."""
        if self.args.bin:
            return os.path.abspath(self.args.bin), f"executables of {self.args.bin}"
        if not targets:
            return os.path.join(ROOT, machine.BUILD), "no executables needed"
        exes = sorted({p for (d, o), t in rowlib.cmake_executables(ROOT).items() if t in targets
                       for p in [os.path.join(d, o)]})
        if not self.args.no_prebuilt:
            bindir, why = machine.use_prebuilt(ROOT, exes, self.env, log)
            if bindir:
                self.say(f"executables from {machine.PREBUILT}: {why.splitlines()[0]}")
                return bindir, "prebuilt pack (clang++, Release): " + why.splitlines()[0]
            self.say(f"prebuilt pack not used: {why}")
        # With the suite in this call, the rows' targets build first in the suite's folder
        # (warnings as errors), the suite's build then going on from there; a row target that
        # fails there (a g++-only warning) builds again in the rows' own folder, warnings on.
        with_suite = any(self.rows[n].get("kind") == "suite" for n in self.names)
        plans = []
        if self.args.werror is not None:
            plans.append((machine.SUITE_BUILD if with_suite and self.args.werror else machine.BUILD, self.args.werror))
        else:
            plans += [(machine.SUITE_BUILD, True)] if with_suite else []
            plans.append((machine.BUILD, False))
        for build, werror in plans:
            bindir, how, status = self.build(build, werror, targets)
            if status != "failed":  # built, or the deadline or the configure stopped it
                break
        return bindir, how

    def build(self, build, werror, targets):
        """Configures BUILD and builds TARGETS: (folder, what built it, "ok", "failed" (a target
        did not build), "deadline" or "configure")."""
        build_log = os.path.join(self.logdir, "build.log")
        bindir = os.path.join(ROOT, build)
        t = time.monotonic()
        if machine.configure(ROOT, build, self.deps, self.env, werror, build_log, self.args.cmake_arg) != 0:
            self.notes.append(f"the CUDA configure of {build} failed (build.log): {suite.tail(build_log, 3)}")
            return bindir, "configure failed", "configure"
        rc, failed = machine.ninja(ROOT, build, self.env, targets, build_log, self.left())
        how = (f"built here in {time.monotonic() - t:.0f} s (g++, Release, {build}, "
               f"DSCPP_WERROR={'ON' if werror else 'OFF'})")
        self.say(how + (f"; FAILED: {', '.join(failed)}" if failed else "") + (" (stopped by the deadline)" if rc == 124 else ""))
        if failed or rc:
            why = "stopped by the deadline" if rc == 124 else f"failed: {', '.join(failed) or f'rc={rc}'}"
            self.notes.append(f"the build of {' '.join(targets)} in {build} {why} (build.log in logs.tgz)")
        return bindir, how, "deadline" if rc == 124 else "failed" if failed or rc else "ok"

    def run_row(self, index, name, instead):
        row = self.rows[name]
        kind = row.get("kind", "train")
        if kind == "suite":
            if self.left() < 60:
                return self.skip(name, f"{max(self.left(), 0):.0f} s left before the deadline")
            self.say("suite: configure, build everything with the tests, ctest")
            deps = self.deps or machine.unpack_debs(ROOT, self.env, open(os.path.join(self.logdir, "setup.log"), "a"))
            t = time.monotonic()
            werror = self.args.werror if self.args.werror is not None else True
            self.suite_lines = suite.run(ROOT, deps, self.env, self.info["gpus"], self.deadline - RESERVE_S,
                                         self.logdir, werror, self.args.cmake_arg, not self.args.suite_fresh)
            for line in self.suite_lines:
                self.say(line)
            text = "\n".join(self.suite_lines)
            ok = ("this call ran" in text or "nothing left to run" in text) and not any(
                k in text for k in ("suite: failed:", "FAILED to build", "configure failed", "not yet run", "not built:"))
            self.entries.append({"name": name, "status": "ran", "wall": round(time.monotonic() - t),
                                 "res": {"tps": None, "tflops": None, "peak_gib": None, "metric": None, "ok": ok,
                                         "note": ("every test passed or skipped" if ok else "NOT all passed")
                                         + ": the suite's lines below the table"}, "at": self.position(name)})
            return
        if rowlib.needs_deepspeed(row) and self.ds_why:
            return self.skip(name, self.ds_why)
        missing = [t for t in rowlib.targets_of(row) if self.missing(t)]
        if missing:
            return self.skip(name, f"no executable for {', '.join(missing)} ({self.binaries})")
        if self.ops is not None and rowlib.ds_ops_of(row, ROOT):
            t = time.monotonic()
            try:
                self.ops.wait(timeout=max(self.left() - row["expect_s"], 1))
                self.say(f"DeepSpeed's ops built (rc={self.ops.returncode}, waited {time.monotonic() - t:.0f} s)")
            except subprocess.TimeoutExpired:
                self.say("DeepSpeed's ops still building: the row builds them itself")
            self.ops = None
        if self.left() < row["expect_s"]:
            return self.skip(name, f"expects {row['expect_s']:.0f} s, {max(self.left(), 0):.0f} s left before the deadline")
        ctx = context(self.args, name, index, self.bindir, os.cpu_count() or 1)
        os.makedirs(ctx["work"], exist_ok=True)
        plan = rowlib.commands(row, ctx)
        for path, text in plan["files"].items():
            with open(path, "w") as f:
                f.write(text)
        env = dict(self.env, **plan["env"])
        log = os.path.join(self.logdir, f"{name}.log")
        limit = min(self.left(), max(3 * row["expect_s"], row["expect_s"] + 120))
        with open(log, "w") as f:
            f.write(f"## row {name} started {datetime.datetime.now(datetime.timezone.utc):%FT%TZ} limit_s={limit:.0f} "
                    f"card={self.info['card']} uuid={self.info['uuid']} binaries={self.binaries}\n")
            for k, v in plan["env"].items():
                f.write(f"## env {k}={v}\n")
        t, rc = time.monotonic(), 0
        for cmd in plan["cmds"]:
            rc = machine.run_logged(cmd, ROOT, env, log, limit - (time.monotonic() - t))
            if rc:
                break
        wall = round(time.monotonic() - t)
        with open(log, "a") as f:
            f.write(f"## row {name} rc={rc} wall_s={wall}\n")
        with open(log, errors="replace") as f:
            text = f.read()
        model = None
        if row.get("kind", "train") == "train":
            model = next((p for p in plan["files"] if p.endswith("model.json")),
                         os.path.join(ROOT, self.args.model or row["model"]))
        res = measure.result(row, text, rc, model)
        self.entries.append({"name": name, "status": "ran", "wall": wall, "res": res, "instead_of": instead,
                             "at": self.position(instead or name)})
        self.say(f"{name}: rc={rc} in {wall} s" + (f", {res['tps']:,.0f} tokens/s" if res["tps"] else ""))

    def position(self, name):
        return self.names.index(name) if name in self.names else len(self.names)

    def missing(self, target):
        for (d, o), t in rowlib.cmake_executables(ROOT).items():
            if t == target:
                return not os.access(os.path.join(self.bindir, d, o), os.X_OK)
        return True

    def report(self):
        self.entries.sort(key=lambda e: e["at"])
        peak = measure.peak_tflops(self.info["card"])
        now = datetime.datetime.now(datetime.timezone.utc)
        head = [f"# gpu_rows, {now:%Y-%m-%d %H:%M} UTC, {self.info['gpus']} x {self.info['card']} "
                f"({self.info['gib']:.1f} GiB, {self.info['uuid']}), host {self.host:.0f} GiB, {os.cpu_count()} cores",
                f"commit {commit_of(self.args)}; binaries: {self.binaries}; "
                + (f"MFU against {peak:g} TFLOP/s (dense bf16); " if peak else "MFU: no known peak for this card; ")
                + f"{time.monotonic() - self.t0:.0f} s in all", ""]
        lines = head + measure.table(self.entries, self.rows, peak)
        for note in self.notes:
            lines.append(f"\nNOTE: {note}")
        if self.suite_lines:
            lines += [""] + self.suite_lines
        for e in self.entries:
            row = self.rows[e["name"]]
            if e.get("res") is None or not (row.get("tail") or row.get("details")):
                continue
            with open(os.path.join(self.logdir, f"{e['name']}.log"), errors="replace") as f:
                text = f.read()
            found = measure.details(row, text)
            if found:
                lines += ["", f"## {e['name']}: the last line of each kind of its `details`"]
                lines += ["    " + l for l in found]
            if row.get("tail"):
                body = [l for l in text.splitlines() if not l.startswith("## ")]
                lines += ["", f"## {e['name']}: the last {row['tail']} lines of its log"] + body[-row["tail"]:]
        text = "\n".join(lines) + "\n"
        with open(os.path.join(self.args.out, "table.md"), "w") as f:
            f.write(text)
        with open(os.path.join(self.args.out, "rows.json"), "w") as f:
            json.dump({"card": self.info, "commit": commit_of(self.args), "date": f"{now:%FT%TZ}",
                       "binaries": self.binaries, "peak_tflops": peak, "rows": self.entries,
                       "suite": self.suite_lines}, f, indent=1)
        # A device call returns at most 8 files: every log in one archive.
        with tarfile.open(os.path.join(self.args.out, "logs.tgz"), "w:gz") as tar:
            tar.add(self.logdir, arcname="logs")
        shutil.rmtree(self.logdir, ignore_errors=True)
        print(text, end="", flush=True)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out = os.path.abspath(args.out)
    try:
        rows = rowlib.load(args.rows_file, ROOT)
    except rowlib.RowsError as e:
        print(f"gpu_rows: {e}", file=sys.stderr)
        return 2
    if args.list:
        list_rows(rows)
        return 0
    if args.targets:
        names = resolve(args, rows) if args.rows else list(rows)
        print(" ".join(sorted({t for n in names for t in rowlib.targets_of(rows[n])})))
        return 0
    if not args.rows and not args.dry_run:
        print("gpu_rows: name the rows to run (--list names them)", file=sys.stderr)
        return 2
    names = resolve(args, rows) if args.rows else order(list(rows), rows)
    if args.dry_run:
        return dry_run(args, rows, names)
    os.makedirs(args.out, exist_ok=True)
    run = Run(args, rows, names)
    runnable = run.setup()
    for index, (name, instead) in enumerate(runnable):
        run.run_row(index, name, instead)
    run.report()
    return 0 if all(e.get("res") and e["res"]["ok"] for e in run.entries) else 1


if __name__ == "__main__":
    sys.exit(main())
