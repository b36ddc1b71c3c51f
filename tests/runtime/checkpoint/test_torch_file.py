"""dscpp's .pt files against Python's torch.save / torch.load (weights_only=True, the default).

1. The CLI writes a DeepSpeed-model-states-shaped file; torch.load opens it at its defaults and
   every value and tensor is what the CLI put there (dtype, shape, values, compact storages).
2. torch.save writes a file of the same kind; the CLI reads it back with the same values.
3. Truncated or corrupt files give a clear error and a non-zero exit, not a crash.
4. Corrupt zip headers give our error naming the file and the byte, never LibTorch's text.
5. Deep pickles (50,000 nested lists, dicts, tuples; a list holding itself; a value repeated
   at every level) are refused without a crash; 500 levels still read.
Last line: "N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import collections
import enum
import json
import math
import os
import subprocess
import sys
import tempfile
import zipfile

import torch

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def ramp(n, dtype, scale=1.0, shift=0.0):
    return (torch.arange(n, dtype=torch.float64) * scale + shift).to(dtype)


def expected_model_states():
    module = collections.OrderedDict()
    module["embed.weight"] = ramp(12, torch.float32, 0.5, -3.0).reshape(4, 3)
    module["layer.0.weight"] = ramp(6, torch.float16, 0.25, 1.0).reshape(2, 3)
    module["layer.0.bias"] = ramp(5, torch.bfloat16, 2.0, -4.0)
    module["layer.1.weight"] = ramp(6, torch.float32, 1.0, 10.0).reshape(2, 3).t()
    module["layer.1.bias"] = ramp(1000, torch.float32).narrow(0, 500, 4)
    module["double"] = ramp(3, torch.float64, 0.125)
    module["steps"] = ramp(4, torch.int64, 1e12)
    module["int32"] = ramp(4, torch.int32, -7.0)
    module["bytes"] = ramp(5, torch.uint8, 50.0)
    module["mask"] = (torch.arange(6) % 2).to(torch.bool)
    module["scalar"] = torch.tensor(2.5, dtype=torch.float32)
    module["empty"] = torch.empty(0, 3, dtype=torch.float32)
    shapes = collections.OrderedDict([("embed.weight", [4, 3]), ("layer.0.weight", [2, 3])])
    shared = ramp(3, torch.float32, 1.0, 100.0)
    return {
        "module": module,
        "buffer_names": ["bn.running_mean", "bn.running_var"],
        "optimizer": None,
        "param_shapes": [shapes],
        "frozen_param_shapes": None,
        "shared_params": {},
        "lr_scheduler": {
            "last_batch_iteration": 41,
            "warmup_min_lr": 0.0,
            "warmup_max_lr": 0.001,
            "_last_lr": [0.00042],
        },
        "data_sampler": None,
        "random_ltd": None,
        "sparse_tensor_module_names": [],
        "skipped_steps": 0,
        "global_steps": 42,
        "global_samples": 336,
        "dp_world_size": 1,
        "mp_world_size": 1,
        "ds_config": {
            "train_batch_size": 8,
            "fp16": {"enabled": True, "loss_scale": 0.0},
            "zero_optimization": {"stage": 2, "offload": None},
            "optimizer": {
                "type": "AdamW",
                "params": {"lr": 0.001, "betas": [0.9, 0.999], "weight_decay": 0.01},
            },
        },
        "ds_version": "0.19.8",
        "loss_scale": 65536.0,
        "overflow": False,
        "big_int": -5000000000,
        "neg_small": -3,
        "medium": 70000,
        "unicode": "grüße ✓",
        "tuple": (1, "two", 3.0, None),
        "small_tuple": (7, 8),
        "int_keys": {0: "zero", 1: "one"},
        "shared_a": shared,
        "shared_b": shared,
    }


def same(path, got, want):
    """Exact structural comparison of what torch.load returned with what we expect."""
    if isinstance(want, torch.Tensor):
        check(path + " is tensor", isinstance(got, torch.Tensor), type(got))
        if not isinstance(got, torch.Tensor):
            return
        check(path + " dtype", got.dtype == want.dtype, f"{got.dtype} != {want.dtype}")
        check(path + " shape", got.shape == want.shape, f"{got.shape} != {want.shape}")
        if got.dtype == want.dtype and got.shape == want.shape:
            check(path + " values", torch.equal(got, want), f"{got} != {want}")
        nbytes = got.numel() * got.element_size()
        check(path + " compact storage", got.untyped_storage().nbytes() == nbytes,
              f"storage {got.untyped_storage().nbytes()} bytes for {nbytes}")
        check(path + " on cpu", got.device.type == "cpu")
        return
    check(path + " type", type(got) is type(want), f"{type(got).__name__} != {type(want).__name__}")
    if type(got) is not type(want):
        return
    if isinstance(want, dict):
        check(path + " keys", list(got.keys()) == list(want.keys()),
              f"{list(got.keys())} != {list(want.keys())}")
        for k in want:
            if k in got:
                same(f"{path}[{k!r}]", got[k], want[k])
    elif isinstance(want, (list, tuple)):
        check(path + " len", len(got) == len(want), f"{len(got)} != {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            same(f"{path}[{i}]", g, w)
    elif isinstance(want, float):
        check(path, got == want or (math.isnan(got) and math.isnan(want)), f"{got!r} != {want!r}")
    else:
        check(path, got == want, f"{got!r} != {want!r}")


DTYPE_NAMES = {
    torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.float64: "Double", torch.int64: "Long", torch.int32: "Int", torch.int16: "Short",
    torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
}


def to_json(v):
    """What the CLI's `read` prints for a value, computed from the Python object."""
    if isinstance(v, torch.Tensor):
        d = v.detach().to(torch.float64).contiguous()
        return {"tensor": {"dtype": DTYPE_NAMES[v.dtype], "shape": list(v.shape),
                           "sum": d.sum().item() if d.numel() else 0.0,
                           "values": d.flatten().tolist()}}
    if isinstance(v, torch.Size):
        return {"tuple": list(v)}
    if isinstance(v, torch.device):
        return str(v)
    if isinstance(v, tuple):
        return {"tuple": [to_json(x) for x in v]}
    if isinstance(v, list):
        return [to_json(x) for x in v]
    if isinstance(v, dict):
        kind = "ordered_dict" if isinstance(v, collections.OrderedDict) else "dict"
        return {kind: [[to_json(k), to_json(x)] for k, x in v.items()]}
    return v


def json_same(path, got, want):
    if isinstance(want, dict) and "tensor" in want and isinstance(got, dict) and "tensor" in got:
        g, w = got["tensor"], want["tensor"]
        for k in ("dtype", "shape", "values"):
            check(f"{path} {k}", g[k] == w[k], f"{g[k]} != {w[k]}")
        check(f"{path} sum", math.isclose(g["sum"], w["sum"], rel_tol=1e-12, abs_tol=1e-12),
              f"{g['sum']} != {w['sum']}")
        return
    if isinstance(want, dict):
        check(path + " type", isinstance(got, dict) and list(got) == list(want),
              f"{got!r:.200} != {want!r:.200}")
        if isinstance(got, dict):
            for k in want:
                if k in got:
                    json_same(f"{path}.{k}", got[k], want[k])
        return
    if isinstance(want, list):
        check(path + " len", isinstance(got, list) and len(got) == len(want),
              f"{got!r:.200} != {want!r:.200}")
        if isinstance(got, list):
            for i, (g, w) in enumerate(zip(got, want)):
                json_same(f"{path}[{i}]", g, w)
        return
    check(path, type(got) is type(want) and got == want, f"{got!r} != {want!r}")


class ZeroStageEnum(int, enum.Enum):  # pickles like DeepSpeed's (getattr by name)
    disabled = 0
    optimizer_states = 1
    gradients = 2


class LossScaler:  # a plain object, as DeepSpeed's optimizer states hold
    def __init__(self):
        self.cur_scale = 1024.0
        self.dynamic = True


LIBTORCH_WORDS = ("PytorchStreamReader", "inline_container", "miniz", "Exception raised from")


def u32(b, at):
    return int.from_bytes(b[at:at + 4], "little")


def put(b, at, value, n):
    return b[:at] + value.to_bytes(n, "little") + b[at + n:]


def zip_corruptions(data):
    """(name, bytes) pairs: the archive with one of its headers made wrong."""
    end = data.rfind(b"PK\x05\x06")
    cd = u32(data, end + 16)
    first_local = u32(data, cd + 42)
    return [
        ("end signature", data[:end] + b"XX\x05\x06" + data[end + 4:]),
        ("directory offset past the end", put(data, end + 16, len(data) + 100, 4)),
        ("directory size past the end", put(data, end + 12, 0x7FFFFFF0, 4)),
        ("entry count beyond the directory", put(put(data, end + 8, 0xFFF0, 2), end + 10, 0xFFF0, 2)),
        ("entry signature", data[:cd] + b"PK\x09\x09" + data[cd + 4:]),
        ("compressed method", put(data, cd + 10, 8, 2)),
        ("record size past the records", put(put(data, cd + 20, 0x7FFFFFF0, 4), cd + 24, 0x7FFFFFF0, 4)),
        ("local header offset past the directory", put(data, cd + 42, cd + 10, 4)),
        ("local header signature", data[:first_local] + b"PK\x07\x07" + data[first_local + 4:]),
        ("name length past the directory", put(data, cd + 28, 0xFFFF, 2)),
    ]


def pickle_zip(path, pkl):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")


def deep_pickles(n):
    """(name, pickle protocol 2 bytes) nested n levels."""
    lists = b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."
    dicts = b"\x80\x02}" + b"K\x00}" * (n - 1) + b"s" * (n - 1) + b"."
    tuples = b"\x80\x02)" + b"\x85" * n + b"."
    return [("lists", lists), ("dicts", dicts), ("tuples", tuples)]


def repeated(levels):
    """A list of two references to the previous level's, `levels` times: 2^levels values."""
    body = b"\x80\x02N"
    for k in range(levels):
        m = bytes([k])
        body += b"q" + m + b"(h" + m + b"h" + m + b"l"
    return body + b"."


def run_cli(cli, *args):
    return subprocess.run([cli, *args], capture_output=True, text=True, timeout=60)


def python_saved_structure():
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(ramp(6, torch.float32, 0.5, -1.0).reshape(2, 3))
        lin.bias.copy_(torch.tensor([0.25, -0.75]))
    base = ramp(20, torch.float32, 1.0, 1.0)
    module = lin.state_dict()  # OrderedDict with _metadata (BUILD)
    module["half"] = ramp(8, torch.float16, 0.5).reshape(2, 4)
    module["bf16"] = ramp(4, torch.bfloat16, -1.5)
    module["view_a"] = base[2:6]  # views sharing one storage
    module["view_b"] = base.reshape(4, 5)[:, 1]
    module["long"] = ramp(3, torch.int64, 1e12, -5)
    module["int"] = ramp(3, torch.int32, 3)
    module["u8"] = ramp(3, torch.uint8, 7)
    module["bool"] = torch.tensor([True, False, True])
    module["double"] = ramp(3, torch.float64, 1.0 / 3.0)
    module["param"] = torch.nn.Parameter(ramp(3, torch.float32, 2.0))
    return {
        "module": module,
        "buffer_names": [],
        "param_shapes": [collections.OrderedDict([("weight", torch.Size([2, 3])),
                                                  ("bias", torch.Size([2]))])],
        "global_steps": 7,
        "global_samples": 2**40,
        "ds_version": "0.19.8",
        "ds_config": {"train_batch_size": 4, "bf16": {"enabled": True}, "gamma": -0.1},
        "lr_scheduler": {"last_batch_iteration": 6, "_last_lr": [1e-4, 2e-4]},
        "loss_scale": 1.0,
        "skipped": True,
        "nothing": None,
        "device": torch.device("cpu"),
        "tuple": (1, 2, 3, 4, 5),
        "int_keys": {1: "a", -2: "b"},
        "many": list(range(2500)),
        "neg": [-1, -129, -40000, -2**31, 2**31, -2**63, 2**63 - 1],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dscpp_torch_file_")

    # 1. Ours -> torch.load at its defaults.
    ours = os.path.join(tmp, "mp_rank_00_model_states.pt")
    r = run_cli(args.cli, "write", ours)
    check("cli write", r.returncode == 0, r.stderr)
    check("no .tmp left", not os.path.exists(ours + ".tmp"))
    if r.returncode == 0:
        names = [i.filename.split("/", 1)[1] for i in zipfile.ZipFile(ours).infolist()]
        check("record layout", names[:4] == ["data.pkl", ".format_version", ".storage_alignment",
                                             "byteorder"] and names[-2:] == [
                                                 "version", ".data/serialization_id"], names)
        try:
            got = torch.load(ours)  # weights_only=True by default
        except Exception as e:  # noqa: BLE001
            check("torch.load(weights_only=True)", False, repr(e))
        else:
            check("torch.load(weights_only=True)", True)
            same("ours", got, expected_model_states())
            check("shared tensor shares storage",
                  got["shared_a"].untyped_storage().data_ptr()
                  == got["shared_b"].untyped_storage().data_ptr())
        # Our reader reads our own file too.
        r = run_cli(args.cli, "read", ours)
        check("cli reads ours", r.returncode == 0, r.stderr)
        if r.returncode == 0:
            json_same("ours-read", json.loads(r.stdout), to_json(expected_model_states()))

    # 2. torch.save -> ours.
    theirs = os.path.join(tmp, "python_saved.pt")
    obj = python_saved_structure()
    torch.save(obj, theirs)
    r = run_cli(args.cli, "read", theirs)
    check("cli reads torch.save file", r.returncode == 0, r.stderr)
    if r.returncode == 0:
        json_same("theirs", json.loads(r.stdout), to_json(obj))

    # DeepSpeed's optimizer-states extras: an enum member and a plain object.
    extras = os.path.join(tmp, "extras.pt")
    torch.save({"zero_stage": ZeroStageEnum.gradients, "loss_scaler": LossScaler()}, extras)
    r = run_cli(args.cli, "read", extras)
    check("cli reads enum and object", r.returncode == 0, r.stderr)
    if r.returncode == 0:
        want = {"dict": [["zero_stage", 2], ["loss_scaler", {"dict": [
            ["__class__", "__main__.LossScaler"], ["cur_scale", 1024.0], ["dynamic", True]]}]]}
        json_same("extras", json.loads(r.stdout), want)

    # 3. Truncated / corrupt files.
    data = open(ours, "rb").read()
    for cut in (0, 10, 200, len(data) // 2, len(data) - 30):
        bad = os.path.join(tmp, f"truncated_{cut}.pt")
        with open(bad, "wb") as f:
            f.write(data[:cut])
        r = run_cli(args.cli, "read", bad)
        check(f"truncated at {cut}: exit 1", r.returncode == 1, f"rc={r.returncode} {r.stderr}")
        check(f"truncated at {cut}: clear error",
              "cannot read torch file" in r.stderr and bad in r.stderr, r.stderr)
    # A data.pkl cut short inside a valid archive.
    cut_pkl = os.path.join(tmp, "cut_pkl.pt")
    with zipfile.ZipFile(ours) as zin, zipfile.ZipFile(cut_pkl, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info)
            if info.filename.endswith("/data.pkl"):
                body = body[: len(body) // 2]
            zout.writestr(info.filename, body)
    r = run_cli(args.cli, "read", cut_pkl)
    check("cut data.pkl: exit 1", r.returncode == 1, f"rc={r.returncode} {r.stderr}")
    check("cut data.pkl: says truncated", "truncated" in r.stderr or "underflow" in r.stderr,
          r.stderr)
    r = run_cli(args.cli, "read", os.path.join(tmp, "missing.pt"))
    check("missing file: exit 1", r.returncode == 1 and "no such file" in r.stderr, r.stderr)

    # 4. Corrupt zip headers: our words, the file and the byte; none of LibTorch's.
    for what, body in zip_corruptions(data):
        bad = os.path.join(tmp, "zip_" + what.replace(" ", "_") + ".pt")
        with open(bad, "wb") as f:
            f.write(body)
        r = run_cli(args.cli, "read", bad)
        check(f"zip {what}: exit 1", r.returncode == 1, f"rc={r.returncode} {r.stderr}")
        check(f"zip {what}: our error naming the file and the byte",
              "cannot read torch file" in r.stderr and bad in r.stderr and "zip archive:" in r.stderr
              and "at byte" in r.stderr, r.stderr)
        check(f"zip {what}: no LibTorch text", not any(w in r.stderr for w in LIBTORCH_WORDS), r.stderr)

    # 5. Deep and repeated pickles: refused (or, within bounds, read), never a crash.
    for what, pkl in deep_pickles(50000):
        bad = os.path.join(tmp, f"deep_{what}.pt")
        pickle_zip(bad, pkl)
        r = run_cli(args.cli, "read", bad)
        check(f"50,000 nested {what}: exit 1", r.returncode == 1, f"rc={r.returncode} {r.stderr[-500:]}")
        check(f"50,000 nested {what}: says so", "nested more than 1000" in r.stderr and bad in r.stderr,
              r.stderr[-500:])
    for what, pkl in deep_pickles(500):
        ok = os.path.join(tmp, f"deep500_{what}.pt")
        pickle_zip(ok, pkl)
        r = run_cli(args.cli, "read", ok)
        check(f"500 nested {what}: read", r.returncode == 0, r.stderr[-500:])
    for what, pkl in (("a list holding itself", b"\x80\x02]q\x00h\x00a."), ("2^40 values", repeated(40))):
        bad = os.path.join(tmp, "cycle.pt")
        pickle_zip(bad, pkl)
        r = run_cli(args.cli, "read", bad)
        check(f"{what}: refused", r.returncode == 1 and "data.pkl:" in r.stderr and bad in r.stderr,
              f"rc={r.returncode} {r.stderr[-500:]}")
    # The deep value Python itself would write is refused the same way.
    sys.setrecursionlimit(20000)  # Python's pickler recurses once per level
    deep = []
    for _ in range(900):
        deep = [deep]
    torch.save({"deep": deep}, os.path.join(tmp, "deep900.pt"))
    r = run_cli(args.cli, "read", os.path.join(tmp, "deep900.pt"))
    check("torch.save's 900 nested lists: read", r.returncode == 0, r.stderr[-500:])

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
