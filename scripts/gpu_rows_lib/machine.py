"""The GPU machine's set-up for a call: what it lacks (carried in .gpu/), the card, and the
executables (the prebuilt pack when it was built from these sources, else a g++ build here).

The machine (Ubuntu 24.04, no network) lacks Boost.Program_options, liburing, yaml-cpp and
Gloo's headers: the Debian packages in .gpu/*.deb are unpacked into DEPS. DeepSpeed comes
from the wheels in .gpu/ds-wheels, installed into a folder on PYTHONPATH, only when a row
imports it; its JIT-built ops (FusedAdam, DeepSpeedCPUAdam: a minute each) build in the
background while the executables build."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

GPU_DIR = ".gpu"
# Where the packages go (GPU_ROWS_DEPS / GPU_ROWS_DSPY: elsewhere, e.g. to try the set-up on a
# machine whose /opt is not this call's to fill).
DEPS = os.environ.get("GPU_ROWS_DEPS", "/opt/deps")
DSPY = os.environ.get("GPU_ROWS_DSPY", "/opt/dspy")
# The rows' build (warnings stay warnings: g++ warns where the CPU machines' clang++ does not,
# and a warning must not cost a call its figures) and the suite's (warnings as errors), in
# folders of their own so that a warm machine's next call rebuilds neither for the other's flag.
BUILD = "build-cuda"
SUITE_BUILD = "build-cuda-suite"
PREBUILT = f"{GPU_DIR}/prebuilt"
# Left out of ctest on a GPU machine: the DeepSpeed comparisons and CPU oracles (CI runs them).
CTEST_EXCLUDE = "DeepSpeed|AgreesWith|SingleRankOracle|Oracle_|TokenIdsEqual"
# A multi-rank test on a machine with fewer GPUs than its ranks is not left out: the launcher
# refuses the job and ctest marks the test skipped (tests/CMakeLists.txt), saying why.


def writable_dir(path, fallback):
    try:
        os.makedirs(path, exist_ok=True)
        return path if os.access(path, os.W_OK) else fallback
    except OSError:
        return fallback


def base_env(root):
    """The environment every row and build runs with."""
    env = dict(os.environ)
    # NVLink multicast stays off on the shared hosts.
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               PYTHONUNBUFFERED="1")
    if os.path.isdir("/opt/gcc/bin"):
        env["PATH"] = "/opt/gcc/bin:" + env.get("PATH", "")
    env["TORCH_EXTENSIONS_DIR"] = os.path.join(root, "build-rows", "torch_extensions")
    return env


def prepend(env, key, value):
    env[key] = value + (":" + env[key] if env.get(key) else "")


def card_info(env):
    """{'card', 'gpus', 'gib', 'uuid'} from torch in a child process (this one holds no CUDA
    context while the rows run), nvidia-smi's UUID for the machine's identity."""
    info = {"card": "none", "gpus": 0, "gib": 0.0, "uuid": "none"}
    code = ("import torch, json\nn = torch.cuda.device_count()\n"
            "print(json.dumps({'gpus': n, 'card': torch.cuda.get_device_name(0) if n else 'none',"
            " 'gib': torch.cuda.get_device_properties(0).total_memory / 2**30 if n else 0.0}))")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        info.update(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        info["card"] = "unknown (torch could not say)"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
        gpus = [l.split(", ") for l in out.stdout.strip().splitlines()] if out.returncode == 0 else []
        if gpus and len(gpus[0]) == 3:
            info["uuid"] = gpus[0][0]
            if not info["gpus"]:  # torch did not answer: nvidia-smi's view
                info.update(gpus=len(gpus), card=gpus[0][1], gib=float(gpus[0][2]) / 1024)
    except (subprocess.SubprocessError, OSError, ValueError):
        pass
    return info


def host_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def unpack_debs(root, env, log):
    """dpkg -x every carried .deb into DEPS; its libraries on LD_LIBRARY_PATH. Returns DEPS."""
    deps = writable_dir(DEPS, os.path.join(root, "build-rows", "deps"))
    debs = sorted(glob.glob(os.path.join(root, GPU_DIR, "*.deb")) + glob.glob(os.path.join(root, GPU_DIR, "*", "*.deb")))
    for deb in debs:
        try:
            r = subprocess.run(["dpkg", "-x", deb, deps], capture_output=True, text=True)
            log.write(f"dpkg -x {deb}: rc={r.returncode} {r.stderr.strip()}\n")
        except OSError as e:
            log.write(f"dpkg -x {deb}: {e}\n")
    if not debs:
        log.write(f"no .deb in {GPU_DIR}/: Boost.Program_options, liburing, yaml-cpp and Gloo's headers must be here\n")
    prepend(env, "LD_LIBRARY_PATH", os.path.join(deps, "usr/lib/x86_64-linux-gnu"))
    return deps


# What the CUDA build and its executables need from the .debs, by a file each holds (in DEPS or
# the system), and the package that brings it.
NEEDED = [("usr/lib/x86_64-linux-gnu/libboost_program_options.so.1.74.0", "libboost-program-options1.74.0"),
          ("usr/include/boost/program_options.hpp", "libboost-program-options1.74-dev"),
          ("usr/lib/x86_64-linux-gnu/liburing.so.2", "liburing2"),
          ("usr/include/liburing.h", "liburing-dev"),
          ("usr/include/gloo/rendezvous/store.h", "libgloo-dev"),
          ("usr/lib/x86_64-linux-gnu/cmake/yaml-cpp", "libyaml-cpp-dev (and libyaml-cpp0.7)")]


def missing_packages(deps):
    """The packages whose files are neither in DEPS nor on the system."""
    return [pkg for path, pkg in NEEDED if not os.path.exists(os.path.join(deps, path))
            and not os.path.exists(os.path.join("/", path))]


def install_deepspeed(root, env, log):
    """The carried wheels into DSPY (on PYTHONPATH); None, or why DeepSpeed is not there."""
    probe = [sys.executable, "-c", "import deepspeed"]
    # Found without importing it (an import of DeepSpeed takes seconds); the import after the
    # install checks that its dependencies came too.
    find = [sys.executable, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)"]
    if subprocess.run(find, env=env, capture_output=True).returncode == 0:
        return None
    wheels = sorted(glob.glob(os.path.join(root, GPU_DIR, "ds-wheels", "*.whl")))
    if not wheels:
        return (f"no DeepSpeed here and no wheels in {GPU_DIR}/ds-wheels (DeepSpeed 0.19.8 and the packages it "
                "needs, as Python 3.12 wheels)")
    target = writable_dir(DSPY, os.path.join(root, "build-rows", "dspy"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", target]
                       + wheels, env=env, capture_output=True, text=True)
    log.write(f"pip install --target {target}: rc={r.returncode}\n{r.stdout}{r.stderr}\n")
    prepend(env, "PYTHONPATH", target)
    if subprocess.run(probe, env=env, capture_output=True).returncode != 0:
        return f"DeepSpeed did not install from {GPU_DIR}/ds-wheels (see setup.log)"
    return None


def start_ds_ops(ops, env, log_path):
    """JIT-builds DeepSpeed's ops in the background (TORCH_EXTENSIONS_DIR); the Popen or None."""
    if not ops:
        return None
    builders = {"cpu_adam": "CPUAdamBuilder", "fused_adam": "FusedAdamBuilder"}
    code = "; ".join(f"from deepspeed.ops.op_builder import {builders[o]}; {builders[o]}().load()" for o in sorted(ops))
    os.makedirs(env["TORCH_EXTENSIONS_DIR"], exist_ok=True)
    op_env = dict(env, TORCH_CUDA_ARCH_LIST="9.0")
    return subprocess.Popen([sys.executable, "-c", code], env=op_env, stdout=open(log_path, "w"),
                            stderr=subprocess.STDOUT)


def use_prebuilt(root, exes, env, log):
    """The pack's executables folder if the pack was built from these sources and holds every
    executable in EXES (paths under build-cuda/); else (None, why)."""
    pack = os.path.join(root, PREBUILT)
    if not os.path.isfile(os.path.join(pack, "sources.sha256")):
        return None, f"no {PREBUILT} (scripts/gpu_prebuild.sh makes it)"
    r = subprocess.run(["sha256sum", "-c", "--quiet", os.path.join(PREBUILT, "sources.sha256")], cwd=root,
                       capture_output=True, text=True)
    if r.returncode != 0:
        log.write(r.stdout + r.stderr)
        return None, "sources changed since the prebuild"
    dest = os.path.join(root, "build-rows", "prebuilt")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    r = subprocess.run(["tar", "-C", dest, "-xJf", os.path.join(pack, "bin.tar.xz")], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"the pack did not unpack: {r.stderr.strip()[:200]}"
    bindir = os.path.join(dest, "build-cuda")
    missing = [e for e in exes if not os.access(os.path.join(bindir, e), os.X_OK)]
    if missing:
        return None, f"the pack lacks {', '.join(missing)}"
    # LibTorch's, CUDA's and NCCL's libraries from this machine's torch; yaml-cpp and
    # protobuf-lite from the pack, last, so that no Python process here loads them for its own.
    tdir = subprocess.run([sys.executable, "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
                          env=env, capture_output=True, text=True).stdout.strip()
    site = os.path.dirname(tdir)
    paths = ":".join([os.path.join(tdir, "lib"), os.path.join(site, "nvidia/cu13/lib"),
                      os.path.join(site, "nvidia/nccl/lib"), env.get("LD_LIBRARY_PATH", ""), os.path.join(dest, "lib")])
    # The pack's executables start here (their libraries found) or the rows build their own.
    report = os.path.join(bindir, "tools", "dscpp_report")
    if os.access(report, os.X_OK):
        r = subprocess.run([report], env=dict(env, LD_LIBRARY_PATH=paths), capture_output=True, text=True, timeout=120)
        log.write(f"prebuilt dscpp_report: rc={r.returncode}\n{r.stdout}{r.stderr}\n")
        if r.returncode != 0:
            return None, f"the pack's dscpp_report does not start here: {(r.stderr or r.stdout).strip()[-200:]}"
    env["LD_LIBRARY_PATH"] = paths
    with open(os.path.join(pack, "BUILT")) as f:
        built = f.read().strip()
    log.write(f"prebuilt: {built}\n")
    return bindir, built


def configure(root, build, deps, env, werror, log_path, extra_args=()):
    """cmake for the CUDA variant in BUILD, Release, with g++ (the machine's compiler)."""
    gxx = shutil.which("g++", path=env["PATH"]) or "g++"
    args = ["cmake", "-S", ".", "-B", build, "-G", "Ninja", "-DDSCPP_CUDA=ON", "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_CXX_COMPILER={gxx}", f"-DCMAKE_CUDA_HOST_COMPILER={gxx}",
            f"-DDSCPP_PYTHON={sys.executable}", f"-DCMAKE_PREFIX_PATH={deps}/usr",
            f"-DDSCPP_GLOO_INCLUDE={deps}/usr/include",
            f"-DDSCPP_BOOST_PO_LIBRARY={deps}/usr/lib/x86_64-linux-gnu/libboost_program_options.so.1.74.0",
            f"-DDSCPP_BOOST_PO_INCLUDE={deps}/usr/include", f"-DDSCPP_WERROR={'ON' if werror else 'OFF'}"]
    args += list(extra_args)
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(args) + "\n")
        log.flush()
        return subprocess.run(args, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def run_logged(args, cwd, env, log_path, timeout):
    """Runs ARGS with its output appended to LOG_PATH; past TIMEOUT seconds its whole process
    group is stopped (SIGTERM, then SIGKILL 10 s later) and the rc is 124, as timeout(1) says."""
    with open(log_path, "a") as log:
        log.write("## $ " + " ".join(args) + "\n")
        log.flush()
        try:
            p = subprocess.Popen(args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            log.write(f"cannot start: {e}\n")
            return 127
        try:
            return p.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            # Ranks the launcher started in their own groups may hold the GPU a moment longer.
            time.sleep(5)
            log.write(f"\n## stopped at its time limit ({timeout:.0f} s)\n")
            return 124


def ninja(root, build, env, targets, log_path, timeout):
    """ninja -k 0 (a target that fails leaves the others built); rc, the outputs that failed."""
    args = ["ninja", "-C", build, "-k", "0", "-j", str(os.cpu_count() or 8)] + list(targets)
    # The log may hold an earlier build's lines (another folder's): only this one's count.
    start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    rc = run_logged(args, root, env, log_path, timeout)
    with open(log_path, errors="replace") as f:
        f.seek(start)
        text = f.read()
    failed = sorted({l.split("FAILED: ", 1)[1].split()[0] for l in text.splitlines() if l.startswith("FAILED: ")})
    return rc, failed
