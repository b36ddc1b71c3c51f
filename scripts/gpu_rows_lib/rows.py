"""bench/rows.toml: reading and checking the table of rows, and a row's command lines.

load() returns every row checked (known keys, systems and kinds, files that exist, references
and sized-down rows that are rows, executables that some CMakeLists.txt builds); a table with
a bad row raises RowsError naming each problem as rows.NAME.KEY. commands() turns one row into
the command lines, environment and derived config files it runs with, the same on a CPU
machine (--dry-run) as on the GPU one."""
import json
import os
import re
import tomllib

SYSTEMS = ("dscpp", "deepspeed", "pytorch-eager", "pytorch-compile", "torchao")
KINDS = ("train", "program", "suite")
TYPES = {  # key: the types it takes
    "kind": str, "system": str, "description": str, "model": str, "model_set": dict, "ds_config": str,
    "ds_set": dict, "steps": int, "warmup": int, "gpus": int, "needs_gib": (int, float),
    "needs_host_gib": (int, float), "smaller": str, "reference": (str, list), "expect_s": (int, float),
    "adam": str, "compile": str, "mode": str, "program": str, "args": list, "env": dict, "host_rss": bool,
    "commands": list, "targets": list, "deepspeed": bool, "ds_ops": list, "metric": dict, "summary": list,
    "tail": int, "details": list, "log_interval": int,
}
TRAIN_KEYS = {"system", "model", "model_set", "ds_config", "ds_set", "steps", "warmup", "adam", "compile",
              "mode", "program", "args", "host_rss", "log_interval"}
PROGRAM_KEYS = {"commands", "targets", "deepspeed", "ds_ops", "metric", "summary"}
DS_OPS = ("cpu_adam", "fused_adam")
# The executables of each system's train rows (CMake targets) and where the build puts them.
LAUNCHER, TRAIN_GPT = "{bin}/launcher/dscpp", "{bin}/examples/train_gpt"


class RowsError(Exception):
    """A rows file that cannot be used: every problem found, one a line."""


def strip_comments(text):
    """ds_config files may hold // comments outside strings (DeepSpeed reads them with hjson)."""
    out = []
    for line in text.splitlines():
        in_str, i = False, 0
        while i < len(line):
            if line[i] == '"' and (i == 0 or line[i - 1] != "\\"):
                in_str = not in_str
            if not in_str and line.startswith("//", i):
                line = line[:i]
                break
            i += 1
        out.append(line)
    return "\n".join(out)


def read_json(path):
    with open(path) as f:
        return json.loads(strip_comments(f.read()))


def cmake_executables(root):
    """{(folder relative to root, output name): target} of every add_executable in the tree
    (a folder's CMakeLists.txt and the *.cmake files beside it that it includes)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "build")) and d not in ("__pycache__", "cmake")]
        if "CMakeLists.txt" not in filenames:
            continue
        text = ""
        for name in ["CMakeLists.txt"] + sorted(f for f in filenames if f.endswith(".cmake")):
            with open(os.path.join(dirpath, name)) as f:
                text += f.read() + "\n"
        rel = os.path.relpath(dirpath, root)
        names = {t: t for t in re.findall(r"add_executable\(\s*([\w.-]+)", text)}
        for target, output in re.findall(r"set_target_properties\(\s*([\w.-]+)\s+PROPERTIES\s+OUTPUT_NAME\s+([\w.-]+)",
                                         text):
            if target in names:
                names[target] = output
        for target, output in names.items():
            found[(rel, output)] = target
    return found


def references(row):
    ref = row.get("reference", [])
    return [ref] if isinstance(ref, str) else list(ref)


def load(path, root):
    """The rows of PATH (a dict name -> row, each row a dict with 'name'), checked against the
    tree at ROOT."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RowsError(f"{path}: {e}") from None
    rows = doc.get("rows")
    errors = [f"{path}: top-level keys other than [rows.NAME]: {', '.join(sorted(set(doc) - {'rows'}))}"] \
        if set(doc) - {"rows"} else []
    if not isinstance(rows, dict) or not rows:
        raise RowsError("\n".join(errors + [f"{path}: no [rows.NAME] tables"]))
    exes = cmake_executables(root)
    for name, row in rows.items():
        row["name"] = name
        errors += [f"{path}: rows.{name}: {e}" for e in check_row(name, row, rows, root, exes)]
    if errors:
        raise RowsError("\n".join(errors))
    return rows


def check_row(name, row, rows, root, exes):
    """The problems of one row, each as 'KEY: what was expected, what was found'."""
    errs = []
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", name):
        errs.append("name: expected lower-case letters, digits, '.' and '-'")
    for key, value in row.items():
        if key == "name":
            continue
        if key not in TYPES:
            errs.append(f"{key}: not a row key (known: {', '.join(sorted(TYPES))})")
        elif isinstance(value, bool) and TYPES[key] in (int, (int, float)) or not isinstance(value, TYPES[key]):
            errs.append(f"{key}: expected {type_name(TYPES[key])}, found {value!r}")
    if errs:
        return errs
    kind = row.get("kind", "train")
    if kind not in KINDS:
        return [f"kind: expected one of {', '.join(KINDS)}, found '{kind}'"]
    if "expect_s" not in row or row["expect_s"] <= 0:
        errs.append("expect_s: expected the row's wall time in seconds (> 0)")
    for ref in references(row):
        if ref not in rows:
            errs.append(f"reference: no row '{ref}'")
        elif ref == name:
            errs.append("reference: a row is not its own reference")
    if "smaller" in row and row["smaller"] not in rows:
        errs.append(f"smaller: no row '{row['smaller']}'")
    if row.get("gpus", 1) < 0:
        errs.append(f"gpus: expected a count >= 0, found {row['gpus']}")
    for key in ("env",):
        for k, v in row.get(key, {}).items():
            if not isinstance(v, str):
                errs.append(f"env.{k}: expected a string, found {v!r}")
    if "args" in row and not all(isinstance(a, str) for a in row["args"]):
        errs.append("args: expected strings")
    if kind == "suite":
        extra = (TRAIN_KEYS | PROGRAM_KEYS) & set(row)
        if extra:
            errs.append(f"{', '.join(sorted(extra))}: not keys of a suite row")
        return errs
    if kind == "program":
        errs += check_program(row, root, exes)
    else:
        errs += check_train(row, root)
    errs += check_patterns(row)
    if kind == "train":
        for ref in references(row):
            if ref in rows and rows[ref].get("kind", "train") != "train":
                errs.append(f"reference: '{ref}' is not a train row (tokens/s do not compare with it)")
    elif "metric" in row:
        for ref in references(row):
            if ref in rows and rows[ref].get("metric", {}).get("unit") != row["metric"].get("unit"):
                errs.append(f"reference: '{ref}' has no metric in {row['metric'].get('unit')}")
    return errs


def type_name(t):
    names = {str: "a string", int: "an integer", bool: "true or false", dict: "a table", list: "an array",
             (int, float): "a number", (str, list): "a row name or an array of them"}
    return names[t]


def check_train(row, root):
    errs = []
    extra = PROGRAM_KEYS & set(row)
    if extra:
        errs.append(f"{', '.join(sorted(extra))}: keys of program rows, not of train rows")
    system = row.get("system")
    if system not in SYSTEMS:
        return errs + [f"system: expected one of {', '.join(SYSTEMS)}, found {system!r}"]
    for key in ("model", "ds_config", "steps", "warmup"):
        if key not in row:
            errs.append(f"{key}: missing (every train row has it)")
    for key in ("model", "ds_config", "program"):
        if key in row and not os.path.isfile(os.path.join(root, row[key])):
            errs.append(f"{key}: no such file '{row[key]}'")
    if errs:
        return errs
    if row["steps"] < 1 or row["warmup"] < 0:
        errs.append(f"steps, warmup: expected steps >= 1 and warmup >= 0, found {row['steps']}, {row['warmup']}")
    elif system == "dscpp" and row["warmup"] % row["steps"]:
        errs.append(f"warmup: train_gpt's figure is its last log interval of `steps` steps, so warmup must be a "
                    f"multiple of steps ({row['steps']}), found {row['warmup']}")
    if "model_set" in row and not row["model"].endswith(".json"):
        errs.append(f"model_set: only a JSON model config takes overrides, found '{row['model']}'")
    try:
        ds = read_json(os.path.join(root, row["ds_config"]))
        for key in row.get("ds_set", {}):
            parent = ds
            for part in key.split(".")[:-1]:
                parent = parent.get(part) if isinstance(parent, dict) else None
            if not isinstance(parent, dict):
                errs.append(f"ds_set.\"{key}\": '{row['ds_config']}' has no table to hold it")
        micro_batch(ds)
    except (OSError, ValueError, KeyError) as e:
        errs.append(f"ds_config: '{row['ds_config']}' unreadable: {e}")
    if "model_set" in row:
        try:
            read_json(os.path.join(root, row["model"]))
        except (OSError, ValueError) as e:
            errs.append(f"model: '{row['model']}' unreadable: {e}")
    if system == "deepspeed":
        if row.get("adam", "fused") not in ("fused", "torch"):
            errs.append(f"adam: expected fused or torch, found '{row['adam']}'")
    elif "adam" in row:
        errs.append("adam: only deepspeed rows pick DeepSpeed's Adam")
    if system in ("pytorch-compile", "torchao"):
        want = "whole" if row.get("mode", "single") == "single" and "program" not in row else "blocks"
        if row.get("compile", want) not in ("whole", "blocks"):
            errs.append(f"compile: expected whole or blocks, found '{row['compile']}'")
        elif row.get("compile") == "whole" and row.get("mode", "single") != "single":
            errs.append("compile: 'whole' compiles one GPU's model; DDP and FSDP2 compile blocks")
    elif "compile" in row:
        errs.append("compile: only pytorch-compile and torchao rows compile")
    if row.get("mode", "single") not in ("single", "ddp", "fsdp2"):
        errs.append(f"mode: expected single, ddp or fsdp2, found '{row['mode']}'")
    elif "mode" in row and not system.startswith("pytorch"):
        errs.append("mode: only pytorch rows take a mode")
    elif row.get("mode", "single") == "single" and row.get("gpus", 1) > 1 and system.startswith("pytorch"):
        errs.append("mode: a PyTorch row on several GPUs is ddp or fsdp2")
    if system == "torchao" and "program" not in row:
        errs.append("program: a torchao row names its program")
    if "program" in row and system in ("dscpp", "deepspeed"):
        errs.append(f"program: {system} rows run {'train_gpt' if system == 'dscpp' else 'bench/deepspeed_gpt.py'}")
    return errs


def check_program(row, root, exes):
    errs = []
    extra = (TRAIN_KEYS & set(row)) - {"args"}
    if extra:
        errs.append(f"{', '.join(sorted(extra))}: keys of train rows, not of program rows")
    cmds = row.get("commands")
    if not cmds or not all(isinstance(c, list) and c and all(isinstance(a, str) for a in c) for c in cmds):
        return errs + ["commands: expected an array of command lines (arrays of strings)"]
    targets = row.get("targets", [])
    if not all(isinstance(t, str) for t in targets):
        errs.append("targets: expected CMake target names")
    for op in row.get("ds_ops", []):
        if op not in DS_OPS:
            errs.append(f"ds_ops: expected some of {', '.join(DS_OPS)}, found '{op}'")
    if row.get("ds_ops") and not row.get("deepspeed"):
        errs.append("ds_ops: DeepSpeed's ops need deepspeed = true")
    known = set(exes.values())
    for t in targets:
        if t not in known:
            errs.append(f"targets: no add_executable({t}) in the tree's CMakeLists.txt")
    for cmd in cmds:
        for arg in cmd:
            for name in re.findall(r"\{(\w+)\}", arg):
                if name not in ("bin", "py", "nproc", "work", "port", "corpus"):
                    errs.append(f"commands: unknown placeholder {{{name}}} in '{arg}'")
            if arg.startswith("{bin}/"):
                rel = arg[len("{bin}/"):]
                target = exes.get((os.path.dirname(rel) or ".", os.path.basename(rel)))
                if target is None:
                    errs.append(f"commands: no executable builds as '{rel}' (add_executable in "
                                f"{os.path.dirname(rel) or '.'}/CMakeLists.txt)")
                elif target not in targets:
                    errs.append(f"commands: '{arg}' is target {target}, not in targets")
            elif arg.endswith(".py") and not arg.startswith("{") and not os.path.isfile(os.path.join(root, arg)):
                errs.append(f"commands: no such file '{arg}'")
    metric = row.get("metric")
    if metric is not None:
        if set(metric) != {"regex", "unit"} or not all(isinstance(v, str) for v in metric.values()):
            errs.append("metric: expected { regex = \"...\", unit = \"...\" }")
        else:
            try:
                if re.compile(metric["regex"], re.M).groups < 1:
                    errs.append("metric.regex: needs a group, the figure")
            except re.error as e:
                errs.append(f"metric.regex: {e}")
    return errs


def check_patterns(row):
    errs = []
    for s in row.get("summary", []) + row.get("details", []):
        try:
            re.compile(s)
        except (re.error, TypeError) as e:
            errs.append(f"summary or details: '{s}': {e}")
    return errs


def micro_batch(ds):
    """(micro-batch, accumulation) of a ds_config, as DeepSpeed derives them on one rank."""
    mb = ds.get("train_micro_batch_size_per_gpu")
    ga = ds.get("gradient_accumulation_steps")
    tb = ds.get("train_batch_size")
    if mb is None:
        raise ValueError("no train_micro_batch_size_per_gpu")
    if ga is None:
        ga = tb // mb if isinstance(tb, int) else 1
    return int(mb), int(ga)


def set_dotted(doc, key, value):
    parts = key.split(".")
    for part in parts[:-1]:
        doc = doc[part]
    doc[parts[-1]] = value


def targets_of(row):
    """The CMake targets a row's commands need."""
    kind = row.get("kind", "train")
    if kind == "program":
        return list(row.get("targets", []))
    if kind == "train" and row["system"] == "dscpp":
        return ["train_gpt", "dscpp_launcher"]
    return []


def needs_deepspeed(row):
    # The suite too: some of its tests read DeepSpeed's files with DeepSpeed's own code. The
    # torchao rows: torchao travels among the same carried wheels and installs with them.
    kind = row.get("kind", "train")
    return (kind == "suite" or kind == "train" and row["system"] in ("deepspeed", "torchao")
            or bool(row.get("deepspeed")))


def ds_ops_of(row, root):
    """DeepSpeed's JIT-built ops a row loads (built once, before the rows, beside the build)."""
    if row.get("kind", "train") == "program":
        return list(row.get("ds_ops", []))
    if row.get("kind", "train") != "train" or row["system"] != "deepspeed" or row.get("adam", "fused") != "fused":
        return []
    ds = read_json(os.path.join(root, row["ds_config"]))
    offload = ds.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    return ["cpu_adam"] if offload in ("cpu", "nvme") else ["fused_adam"]


def commands(row, ctx):
    """The row's run: {'cmds': [argv, ...], 'env': {..}, 'files': {path: text}} for a context
    ctx with bin, py, nproc, work, port, corpus, root, and optional model / steps / warmup
    (a smoke run's replacements for every row's)."""
    kind = row.get("kind", "train")
    env = dict(row.get("env", {}))
    files = {}
    subst = {k: str(ctx[k]) for k in ("bin", "py", "nproc", "work", "port", "corpus")}
    if kind == "program":
        cmds = [[a.format(**subst) for a in cmd] for cmd in row["commands"]]
        return {"cmds": cmds, "env": env, "files": files}
    system, root = row["system"], ctx["root"]
    model = ctx.get("model") or row["model"]
    steps = ctx.get("steps") or row["steps"]
    warmup = ctx["warmup"] if ctx.get("warmup") is not None else row["warmup"]
    if row.get("model_set") and model.endswith(".json"):
        cfg = read_json(os.path.join(root, model))
        cfg.update(row["model_set"])
        model = os.path.join(ctx["work"], "model.json")
        files[model] = json.dumps(cfg, indent=2) + "\n"
    ds_path = row["ds_config"]
    ds = read_json(os.path.join(root, ds_path))
    if row.get("ds_set"):
        for key, value in row["ds_set"].items():
            set_dotted(ds, key, value)
        ds_path = os.path.join(ctx["work"], "ds_config.json")
        files[ds_path] = json.dumps(ds, indent=2) + "\n"
    gpus, port, py = row.get("gpus", 1), str(ctx["port"]), subst["py"]
    args = [a.format(**subst) for a in row.get("args", [])]
    rss = [py, "bench/peak_rss.py"] if row.get("host_rss") else []
    if system == "dscpp":
        cmd = rss + [LAUNCHER.format(**subst), "--num_gpus", str(gpus), "--master_port", port,
                     TRAIN_GPT.format(**subst), "--model-config", model, "--train-data-path", subst["corpus"],
                     "--deepspeed_config", ds_path, "--train-iters", str(warmup + steps),
                     "--log-interval", str(row.get("log_interval", steps))] + args
        return {"cmds": [cmd], "env": env, "files": files}
    if system == "deepspeed":
        # DeepSpeed 0.19.8's op builder cannot parse the 9.0a arch PyTorch reports on an H200.
        env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
        prog = ["bench/deepspeed_gpt.py", "--model-config", model, "--deepspeed_config", ds_path,
                "--adam", row.get("adam", "fused"), "--steps", str(steps), "--warmup", str(warmup)]
    else:
        mb, ga = micro_batch(ds)
        program = row.get("program", "bench/pytorch_gpt.py")
        prog = [program, "--model-config", model]
        if program == "bench/pytorch_moe_gpt.py":
            prog += ["--data-path", subst["corpus"], "--micro-batch", str(mb), "--accumulation", str(ga)]
            if mb > 1:
                prog += ["--fallback-micro-batch", str(mb // 2)]
            if system == "pytorch-eager":
                prog.append("--no-compile")
        elif program == "bench/pytorch_gpt.py":
            prog += ["--mode", row.get("mode", "single"), "--micro-batch", str(mb)]
            if system in ("pytorch-compile", "torchao"):
                whole = row.get("compile", "whole" if row.get("mode", "single") == "single" else "blocks")
                prog.append("--compile-whole" if whole == "whole" else "--compile")
        else:
            prog += ["--micro-batch", str(mb)]
        prog += ["--steps", str(steps), "--warmup", str(warmup)]
    if gpus > 1:
        cmd = rss + [py, "-m", "torch.distributed.run", "--nproc_per_node", str(gpus), "--master_port", port]
    else:
        env.setdefault("MASTER_PORT", port)
        cmd = rss + [py]
    return {"cmds": [cmd + prog + args], "env": env, "files": files}
