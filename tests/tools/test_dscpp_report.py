"""dscpp_report prints what DeepSpeed's ds_report prints that applies: the op table
(compiled, usable) and the environment, each field checked against an independent source (the
venv's torch for the LibTorch version, os for the CPU count and /dev/shm, the build's own
settings for the build type and variant), in the text layout and in --json alike."""
import argparse
import os
import re
import subprocess
import sys

FAILED = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name)
    if not ok:
        FAILED.append(name)
        print(str(detail)[-3000:])


def field(text, key):
    m = re.search(r"^" + re.escape(key) + r" \.+ (.*)$", text, re.M)
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", required=True)
    ap.add_argument("--build-type", required=True)
    ap.add_argument("--cuda-build", required=True)
    args = ap.parse_args()
    cuda_build = args.cuda_build in ("1", "ON", "TRUE", "true")
    p = subprocess.run([args.report], capture_output=True, text=True, timeout=60)
    out = p.stdout
    check("runs", p.returncode == 0, p.stderr)
    j = subprocess.run([args.report, "--json"], capture_output=True, text=True, timeout=60)
    import json
    r = json.loads(j.stdout)

    # The op table, as ds_report's: every op a row with compiled and usable.
    check("the op report's header", "dscpp C++/CUDA op report" in out and "op name" in out and "compiled .. usable" in out, out)
    ops = {o["name"]: o for o in r["ops"]}
    for name in ("fused_adam", "bias_gelu_cuda", "cross_entropy_cuda", "bias_gelu", "cross_entropy", "comm_gloo",
                 "comm_nccl"):
        check(f"op {name} is reported", name in ops and re.search(r"^" + re.escape(name) + r" \.+ \[", out, re.M), out)
    gpu = cuda_build and r["cuda_device_count"] > 0
    for name in ("fused_adam", "bias_gelu_cuda", "cross_entropy_cuda", "comm_nccl"):
        check(f"{name}: compiled iff the CUDA build, usable iff a GPU too",
              ops[name]["compiled"] == cuda_build and ops[name]["usable"] == gpu, ops[name])
    for name in ("bias_gelu", "cross_entropy", "comm_gloo", "fp8_linear"):
        check(f"{name}: compiled and usable everywhere", ops[name]["compiled"] and ops[name]["usable"], ops[name])
    # FP8 on the GPU: where the CUDA build sees devices of compute capability 8.9 or later.
    devices = r.get("cuda", {}).get("devices", []) if isinstance(r.get("cuda"), dict) else []
    fp8_cores = bool(devices) and all(tuple(map(int, d["compute_capability"].split("."))) >= (8, 9)
                                      for d in devices)
    check("fp8_linear_cuda: usable iff a GPU with FP8 tensor cores",
          "fp8_linear_cuda" in ops and ops["fp8_linear_cuda"]["usable"] == (gpu and fp8_cores), ops.get("fp8_linear_cuda"))
    if not cuda_build:
        check("a CPU build says why its kernels are not usable",
              re.search(r"^fused_adam \.+ \[NO\] +\.+ \[NO\] +\(not in a CPU build", out, re.M), out)

    # Versions, against the venv's torch (the LibTorch we link is its wheel's).
    try:
        import torch
        want = torch.__version__.split("+")[0]
        check(f"libtorch version is torch's {want}", (field(out, "libtorch version") or "").startswith(want), out)
    except ImportError:
        print("SKIP libtorch version: no torch in this Python")
    lib = field(out, "libtorch library path") or ""
    check("the libtorch library path is a loaded libtorch .so",
          os.path.isfile(lib) and re.search(r"libtorch[_a-z]*\.so", os.path.basename(lib)), lib)
    check("dscpp version", re.fullmatch(r"\d+\.\d+\.\d+", field(out, "dscpp version") or ""), out)
    check("the compiler", re.match(r"(clang|g\+\+) \d", field(out, "dscpp compiled w.") or ""), out)
    check(f"the build type is {args.build_type}", field(out, "dscpp build type") == args.build_type, out)
    check("cuda build", field(out, "cuda build") == ("yes" if cuda_build else "no"), out)
    if not cuda_build:
        check("no CUDA, no NCCL in a CPU build",
              "not compiled in" in (field(out, "cuda runtime version") or "")
              and "not compiled in" in (field(out, "nccl version") or ""), out)
    else:
        check("the NCCL version", re.fullmatch(r"\d+\.\d+\.\d+", field(out, "nccl version") or ""), out)

    # Paths and the machine.
    exe = os.path.realpath(args.report)
    check("the install path is the folder above the tool's",
          field(out, "dscpp install path") == os.path.dirname(os.path.dirname(exe)), out)
    check("cpu threads", field(out, "cpu threads") == str(os.cpu_count()), out)
    st = os.statvfs("/dev/shm")
    check("/dev/shm size", field(out, "shared memory (/dev/shm) size") ==
          f"{st.f_blocks * st.f_frsize / 2**30:.2f} GB", out)
    check("cuda devices", field(out, "cuda devices") == str(r["cuda_device_count"]), out)
    check("--json holds the text's fields",
          r["build_type"] == args.build_type and r["libtorch_library"] == lib and r["cpu_threads"] == os.cpu_count(), r)

    # --config-list: many configs in one process, each answered as --config answers it; a
    # malformed request line is answered (exit 2 naming file:line) and the next still runs.
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        good = json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
                           "gradient_clipping": "auto"})
        bad = json.dumps({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"lr": -1}}})
        listing = os.path.join(tmp, "list.jsonl")
        with open(listing, "w") as f:
            f.write(json.dumps({"config": good, "world_size": 4,
                                "autos": {"train_batch_size": 8, "gradient_clipping": 0.5}}) + "\n")
            f.write("{not json\n")
            f.write(json.dumps({"config": good, "world_size": "four"}) + "\n")
            f.write(json.dumps({"config": bad}) + "\n")
        lst = subprocess.run([args.report, "--config-list", listing], capture_output=True, text=True, timeout=60)
        answers = [json.loads(l) for l in lst.stdout.splitlines()]
        one = subprocess.run([args.report, "--config", good, "--world-size", "4", "--auto", "train_batch_size=8",
                              "--auto", "gradient_clipping=0.5"], capture_output=True, text=True, timeout=60)
        two = subprocess.run([args.report, "--config", bad], capture_output=True, text=True, timeout=60)
        # An "auto" left unfilled: the tool's own --auto is the way to fill it (not the C++ API).
        unfilled = subprocess.run([args.report, "--config", good, "--world-size", "4"], capture_output=True,
                                  text=True, timeout=60)
        check("--config with an unfilled auto names --auto, not dscpp::initialize",
              unfilled.returncode == 2 and 'train_batch_size: is "auto" and no value was supplied for it: give it '
              "with --auto KEY=VALUE or write a number in the config" in unfilled.stderr
              and "initialize" not in unfilled.stderr, unfilled.stderr)
        check("--config-list answers every line", lst.returncode == 0 and len(answers) == 4, lst.stdout + lst.stderr)
        if len(answers) == 4:
            check("--config-list: a config resolved as --config resolves it (its autos filled)",
                  answers[0]["exit"] == 0 and answers[0]["stdout"] == one.stdout
                  and json.loads(answers[0]["stdout"])["train_batch_size"] == 8
                  and json.loads(answers[0]["stdout"])["gradient_clipping"] == 0.5, answers[0])
            check("--config-list: a line that is not JSON is refused by its line number",
                  answers[1]["exit"] == 2 and f"{listing}:2:" in answers[1]["stderr"], answers[1])
            check("--config-list: a world_size of the wrong type is refused by its line number",
                  answers[2]["exit"] == 2 and f"{listing}:3:" in answers[2]["stderr"], answers[2])
            check("--config-list: a refused config gives --config's exit and message",
                  answers[3]["exit"] == two.returncode == 2 and answers[3]["stderr"] == two.stderr
                  and "optimizer.params.lr" in two.stderr, answers[3])
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {FAILED}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
