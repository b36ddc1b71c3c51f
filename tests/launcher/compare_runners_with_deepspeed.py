#!/usr/bin/env python3
"""The multi-node command lines of `dscpp` against those of DeepSpeed's own runner.

    compare_runners_with_deepspeed.py --dscpp build/launcher/dscpp --python .venv/bin/python

For each case (a backend: pdsh, openmpi, mpich, slurm; a hostfile; the launcher's flags) both
launchers really run, DeepSpeed's runner.main in this process (run with the venv's python, so
that its sys.executable is the one it puts into commands), with a PATH whose
pdsh, ssh, mpirun, ompi_info, srun and sinfo are a recorder that writes its argv and
environment and exits 0. The recorded commands are compared after the normalisation below;
what may differ is listed in ALLOWED, each with its reason. A case DeepSpeed refuses (a
ValueError: a backend that cannot filter hosts) must be refused by dscpp too, non-zero and with
a message.

Normalisation (what the remote shell would see, not the bytes):
- the per-node launcher: DeepSpeed's `python -u -m deepspeed.launcher.launch` is dscpp's own
  binary (both become <node-launcher>);
- the remote command of pdsh and ssh is split as the remote shell splits it (DeepSpeed quotes
  arguments with double quotes, dscpp with single ones);
- exported variables are compared as sets of KEY=VALUE, whichever of -x K=V / -genv K V /
  --export=ALL,K=V / `export K=V;` carries them;
- DeepSpeed's `--enable_each_rank_log=None` (its own slip: the string "None" for an unset
  option, which its launch.py then treats as a folder name) is dropped.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

RECORDER = r'''#!/usr/bin/env python3
import json, os, sys
name = os.path.basename(sys.argv[0])
if name == "ssh" and sys.argv[-1] in ("hostname", "hostname -I"):
    print("10.9.9.9")
    sys.exit(0)
with open(os.environ["RECORD_FILE"], "a") as f:
    f.write(json.dumps({"prog": name, "argv": sys.argv[1:],
                        "env": {k: os.environ[k] for k in ("PDSH_RCMD_TYPE", "PDSH_SSH_ARGS_APPEND")
                                if k in os.environ}}) + "\n")
'''

# Differences by design, per backend: exported variables only dscpp adds, and why.
ALLOWED = {
    # The job id every rank of one job shares (comm/launch_env.h): dscpp's rendezvous keys.
    "exports_only_dscpp": {"DSCPP_JOB_ID"},
    # OpenMPI and Slurm ranks of dscpp read the rendezvous address from the environment;
    # DeepSpeed's Python side broadcasts it with mpi4py instead.
    "exports_only_dscpp_mpi": {"MASTER_ADDR", "MASTER_PORT"},
}

HOSTS3 = "node1 slots=2\nnode2 slots=2\nnode3 slots=2\n"
UNEVEN = "node1 slots=2\nnode2 slots=1\n"

# (name, hostfile, launcher, extra flags). The program and its arguments follow.
CASES = [
    ("pdsh", HOSTS3, "pdsh", []),
    ("pdsh include", HOSTS3, "pdsh", ["--include", "node1:0,1@node3"]),
    ("pdsh exclude", HOSTS3, "pdsh", ["--exclude", "node2"]),
    ("pdsh num_nodes", HOSTS3, "pdsh", ["--num_nodes", "2"]),
    ("pdsh launcher_args", HOSTS3, "pdsh", ["--launcher_args", "-R ssh -u 30"]),
    ("pdsh ssh_port", HOSTS3, "pdsh", ["--ssh_port", "2222"]),
    ("pdsh venv", HOSTS3, "pdsh", ["--venv_script", "/opt/venv/bin/activate"]),
    ("pdsh no_local_rank", HOSTS3, "pdsh", ["--no_local_rank"]),
    ("openmpi", HOSTS3, "openmpi", []),
    ("openmpi own btl_tcp_if_include", HOSTS3, "openmpi", ["--launcher_args", "--mca btl_tcp_if_include lo"]),
    ("openmpi refuses include", HOSTS3, "openmpi", ["--include", "node1"]),
    ("openmpi refuses num_gpus", HOSTS3, "openmpi", ["--num_gpus", "1"]),
    ("mpich", HOSTS3, "mpich", []),
    ("mpich refuses exclude", HOSTS3, "mpich", ["--exclude", "node1"]),
    ("mpich refuses uneven slots", UNEVEN, "mpich", []),
    ("slurm", HOSTS3, "slurm", []),
    ("slurm launcher_args", HOSTS3, "slurm", ["--launcher_args", "--partition debug"]),
    ("slurm include hosts", HOSTS3, "slurm", ["--include", "node1@node3"]),
    ("slurm num_nodes", HOSTS3, "slurm", ["--num_nodes", "2"]),
    ("slurm num_gpus", HOSTS3, "slurm", ["--num_gpus", "1"]),
    ("slurm refuses device ids", HOSTS3, "slurm", ["--include", "node1:1"]),
]
PROGRAM = ["--no_python", "./train", "--lr", "0.1", "--name", "a b"]


def run(cmd, cwd, env):
    record = os.path.join(cwd, "record.jsonl")
    if os.path.exists(record):
        os.remove(record)
    p = subprocess.run(cmd, cwd=cwd, env=dict(env, RECORD_FILE=record), capture_output=True, text=True,
                       timeout=120)
    calls = []
    if os.path.exists(record):
        with open(record) as f:
            calls = [json.loads(line) for line in f]
    return p.returncode, p.stdout + p.stderr, calls


def run_deepspeed(argv, cwd, env):
    """DeepSpeed's runner in this process (one import of DeepSpeed for every case)."""
    import contextlib
    import io
    record = os.path.join(cwd, "record.jsonl")
    if os.path.exists(record):
        os.remove(record)
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env, RECORD_FILE=record)
    os.chdir(cwd)
    out = io.StringIO()
    try:
        from deepspeed.launcher import runner
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runner.main(argv)
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # DeepSpeed refuses by raising (ValueError, RuntimeError)
        out.write(f"{type(e).__name__}: {e}")
        rc = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
    calls = []
    if os.path.exists(record):
        with open(record) as f:
            calls = [json.loads(line) for line in f]
    return rc, out.getvalue(), calls


def exports_of_words(words):
    """`export K=V;` words of a remote command -> {K: V}, and the words that remain."""
    out, rest, i = {}, [], 0
    while i < len(words):
        if words[i] == "export" and i + 1 < len(words):
            k, _, v = words[i + 1].rstrip(";").partition("=")
            out[k] = v
            i += 2
        else:
            rest.append(words[i])
            i += 1
    return out, rest


def normalise(call, dscpp, python):
    prog, argv = call["prog"], list(call["argv"])
    exports = {}
    if prog == "pdsh":
        cut = next(i for i, a in enumerate(argv) if a.startswith("export ") or a.startswith("cd ")
                   or a.startswith("source "))
        head, remote = argv[:cut], shlex.split(" ".join(argv[cut:]))
        exports, remote = exports_of_words(remote)
        launcher = [python, "-u", "-m", "deepspeed.launcher.launch"]
        for i in range(len(remote)):
            if remote[i:i + 4] == launcher:
                remote[i:i + 4] = ["<node-launcher>"]
                break
            if remote[i] == dscpp:
                remote[i] = "<node-launcher>"
                break
        remote = [w for w in remote if w != "--enable_each_rank_log=None"]
        return {"prog": prog, "argv": head + remote, "exports": exports, "env": call["env"]}
    if prog == "mpirun" and "-x" in argv:  # openmpi
        rest, i = [], 0
        while i < len(argv):
            if argv[i] == "-x":
                k, _, v = argv[i + 1].partition("=")
                exports[k] = v
                i += 2
            else:
                rest.append(argv[i])
                i += 1
        return {"prog": prog, "argv": rest, "exports": exports, "env": {}}
    if prog == "mpirun":  # mpich: -genv K=V and -genv K V
        rest, i = [], 0
        while i < len(argv):
            if argv[i] == "-genv":
                if "=" in argv[i + 1]:
                    k, _, v = argv[i + 1].partition("=")
                    i += 2
                else:
                    k, v = argv[i + 1], argv[i + 2]
                    i += 3
                exports[k] = v
            else:
                rest.append(argv[i])
                i += 1
        return {"prog": prog, "argv": rest, "exports": exports, "env": {}}
    if prog == "srun":
        rest = []
        for a in argv:
            if a.startswith("--export=ALL"):
                for kv in a.split(",")[1:]:
                    k, _, v = kv.partition("=")
                    exports[k] = v
            else:
                rest.append(a)
        return {"prog": prog, "argv": rest, "exports": exports, "env": {}}
    return {"prog": prog, "argv": argv, "exports": {}, "env": call.get("env", {})}


def compare(name, launcher, ds, ours):
    """Differences not in ALLOWED, as strings."""
    problems = []
    if ds["prog"] != ours["prog"]:
        return [f"program: DeepSpeed runs {ds['prog']}, dscpp {ours['prog']}"]
    allowed = set(ALLOWED["exports_only_dscpp"])
    if launcher in ("openmpi", "slurm", "mpich"):
        allowed |= ALLOWED["exports_only_dscpp_mpi"]
    for k in sorted(set(ds["exports"]) | set(ours["exports"])):
        if k in allowed and k not in ds["exports"]:
            continue
        if ds["exports"].get(k) != ours["exports"].get(k):
            problems.append(f"export {k}: DeepSpeed {ds['exports'].get(k)!r}, dscpp {ours['exports'].get(k)!r}")
    a, b = ds["argv"], ours["argv"]
    if launcher == "mpich":
        # DeepSpeed runs `python -u .../launcher_helper.py --launcher mpich [--no_python]` before
        # the program, to map PMI_* to RANK/LOCAL_RANK; dscpp's ranks read PMI_* themselves.
        j = next((i for i, w in enumerate(a) if w.endswith("launcher_helper.py")), None)
        if j is not None:
            k = j + 1
            while k < len(a) and a[k] in ("--launcher", "mpich", "--no_python", "--module"):
                k += 1
            start = j - 2 if j >= 2 and a[j - 1] == "-u" else j
            a = a[:start] + a[k:]
    if launcher == "slurm" and "--no_python" in PROGRAM and a[-len(PROGRAM) + 1 - 2:-len(PROGRAM) + 1] == [
            ALLOWED["python"], "-u"]:
        # DeepSpeed's SlurmRunner puts `python -u` before the program even under --no_python
        # (its get_cmd never reads the flag); dscpp runs the program as asked.
        a = a[:-len(PROGRAM) + 1 - 2] + a[-len(PROGRAM) + 1:]
    if a != b:
        problems.append(f"command: DeepSpeed {a}\n                  dscpp     {b}")
    # DeepSpeed's PDSH_SSH_ARGS_APPEND carries its source's line-continuation spaces.
    squash = lambda env: {k: " ".join(v.split()) for k, v in env.items()}  # noqa: E731
    if squash(ds["env"]) != squash(ours["env"]):
        problems.append(f"pdsh's environment: DeepSpeed {ds['env']}, dscpp {ours['env']}")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dscpp", required=True)
    ap.add_argument("--python", default=sys.executable, help="this interpreter, as DeepSpeed names it")
    args = ap.parse_args()
    dscpp = os.path.abspath(args.dscpp)
    python = os.path.abspath(args.python)  # the venv's: sys.executable as DeepSpeed sees it
    ALLOWED["python"] = python
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        work = os.path.realpath(work)
        bindir = os.path.join(work, "bin")
        os.makedirs(bindir)
        recorder = os.path.join(bindir, "recorder")
        with open(recorder, "w") as f:
            f.write(RECORDER)
        os.chmod(recorder, 0o755)
        for p in ("pdsh", "ssh", "mpirun", "ompi_info", "srun", "sinfo"):
            os.symlink("recorder", os.path.join(bindir, p))
        with open(os.path.join(work, "train"), "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(os.path.join(work, "train"), 0o755)
        env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": work, "DS_ACCELERATOR": "cpu",
               "PYTHONPATH": "/opt/extra", "UCX_NET_DEVICES": "lo", "MLFLOW_RUN": "r1"}
        for name, hosts, launcher, flags in CASES:
            with open(os.path.join(work, "hostfile"), "w") as f:
                f.write(hosts)
            common = ["-H", "hostfile", "--launcher", launcher, "--master_addr", "10.0.0.1",
                      "--master_port", "29510"] + flags + PROGRAM
            ds_rc, ds_out, ds_calls = run_deepspeed(common, work, env)
            rc, out, calls = run([dscpp] + common, work, env)
            problems = []
            if ds_rc == 0 and not ds_calls:
                # A filter left one host: DeepSpeed launches locally, without the backend.
                if rc != 0 or calls:
                    problems.append(f"DeepSpeed ran locally, dscpp rc {rc} with {calls}: {out[-300:]}")
                verdict = "both run locally (one host left)"
            elif ds_rc != 0 or not ds_calls:
                # DeepSpeed refused: dscpp must refuse too, and say why.
                if rc == 0 or calls:
                    problems.append(f"DeepSpeed refused (rc {ds_rc}: {ds_out.strip().splitlines()[-1:]}), "
                                    f"dscpp ran {calls}")
                elif "dscpp" not in out:
                    problems.append(f"dscpp refused without a message of its own: {out!r}")
                verdict = "both refuse"
            elif rc != 0 or len(calls) != len(ds_calls):
                problems.append(f"dscpp rc {rc}, {len(calls)} commands, DeepSpeed {len(ds_calls)}: {out[-400:]}")
                verdict = ""
            else:
                for d, o in zip(ds_calls, calls):
                    problems += compare(name, launcher, normalise(d, dscpp, python), normalise(o, dscpp, python))
                verdict = "same command"
            if problems:
                failures += 1
                print(f"FAIL {name}:")
                for p in problems:
                    print("    " + p)
            else:
                print(f"ok   {name}: {verdict}")
    print(f"{len(CASES) - failures} of {len(CASES)} cases agree with DeepSpeed's runner")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
