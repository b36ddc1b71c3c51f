#!/usr/bin/env python3
"""DeepSpeed 0.19.8's own resolution of a ds_config file, in dscpp's resolved-config schema.

The reference half of tests/config/compare_with_deepspeed.py (which imports resolve()).

    deepspeed_reference.py CONFIG_FILE --world-size N [--auto KEY=VALUE ...]

Prints one JSON object on stdout: the resolved config, or {"error": "<Type>: <message>"}
when DeepSpeed refuses the file. Exits 0 in both cases. --auto KEY=VALUE (KEY dotted, VALUE
JSON) replaces the value at KEY only where the file has the string "auto", as Hugging Face
does before handing the config to DeepSpeed. Needs DeepSpeed in the venv (DEEPSPEED_SETUP.txt).
"""
import argparse
import contextlib
import enum
import json
import os
import pathlib
import sys
from unittest import mock

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no GPU: skip detection and its warning
with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's logger binds sys.stdout at import
    import hjson
    import torch
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys
    from deepspeed.utils import logger as ds_logger

DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", None: None}

FP16_KEYS = ["enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
             "hysteresis", "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"]
BF16_KEYS = ["enabled", "immediate_grad_update", "check_grad_overflow",
             "bf16_master_weights_and_grads", "bf16_optimizer_states"]
# dscpp (= ds_config json) key -> DeepSpeedZeroConfig field name
ZERO_KEYS = {k: k for k in [
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
    "use_multi_rank_bucket_allreduce", "allgather_partitions", "allgather_bucket_size",
    "overlap_comm", "load_from_fp32_weights", "elastic_checkpoint", "sub_group_size"]}
ZERO_KEYS.update({"stage3_" + k: k for k in [
    "prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
    "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save"]})
ZERO_KEYS.update({k: k for k in [
    "ignore_unused_parameters", "round_robin_gradients", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients"]})
OFFLOAD_OPTIMIZER_KEYS = ["device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read",
                          "pipeline_write", "fast_init", "ratio"]
OFFLOAD_PARAM_KEYS = ["device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"]
ACT_CKPT_KEYS = ["partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
                 "number_checkpoints", "synchronize_checkpoint_boundary", "profile"]


def plain(v):
    """JSON-ready copy: enums -> values, paths -> str, int/float subclasses (pp_int) -> int/float."""
    if isinstance(v, enum.Enum):
        return plain(v.value)
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, pathlib.PurePath):
        return str(v)
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    raise TypeError(f"unexpected value {v!r}")


def pick(obj, keys):
    return {k: plain(getattr(obj, k)) for k in keys}


def apply_autos(cfg, autos):
    """Replace cfg[dotted key] by the given value where it is the string "auto"."""
    for key, value in autos.items():
        *parents, leaf = key.split(".")
        node = cfg
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(leaf) == "auto":
            node[leaf] = value


def to_schema(c):
    """DeepSpeedConfig -> dscpp resolved schema."""
    zero = c.zero_config
    ckpt = "IGNORE" if not c.checkpoint_tag_validation_enabled else (
        "FAIL" if c.checkpoint_tag_validation_fail else "WARN")
    out = {
        "train_batch_size": c.train_batch_size,
        "train_micro_batch_size_per_gpu": c.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "steps_per_print": c.steps_per_print,
        "wall_clock_breakdown": c.wall_clock_breakdown,
        "memory_breakdown": c.memory_breakdown,
        "gradient_clipping": c.gradient_clipping,
        "prescale_gradients": c.prescale_gradients,
        "gradient_predivide_factor": c.gradient_predivide_factor,
        "communication_data_type": DTYPES[c.communication_data_type],
        "zero_allow_untested_optimizer": c.zero_allow_untested_optimizer,
        "zero_force_ds_cpu_optimizer": c.zero_force_ds_cpu_optimizer,
        "fp16": pick(c.float16_config, FP16_KEYS),
        "bf16": pick(c.bfloat16_config, BF16_KEYS),
        "zero_optimization": {k: getattr(zero, f) for k, f in ZERO_KEYS.items()},
        "optimizer": None if c.optimizer_name is None else
                     {"type": c.optimizer_name, "params": c.optimizer_params or {}},
        "scheduler": None if c.scheduler_name is None else
                     {"type": c.scheduler_name, "params": c.scheduler_params or {}},
        "activation_checkpointing": pick(c.activation_checkpointing_config, ACT_CKPT_KEYS),
        "checkpoint": {"tag_validation": ckpt, "load_universal": c.load_universal_checkpoint,
                       "use_node_local_storage": c.use_node_local_storage},
    }
    for key, fields in (("offload_optimizer", OFFLOAD_OPTIMIZER_KEYS), ("offload_param", OFFLOAD_PARAM_KEYS)):
        sub = getattr(zero, key)
        out["zero_optimization"][key] = None if sub is None else pick(sub, fields)
    return plain(out)


def resolve(path, world_size, autos=None):
    """DeepSpeed's resolution of the config file at `path` for data-parallel size `world_size`.

    Returns the resolved dict, or {"error": "<ExceptionType>: <message>"} if DeepSpeed refuses it.
    """
    try:
        with open(path) as f:  # exactly as DeepSpeedConfig(path) reads it
            cfg = hjson.load(f, object_pairs_hook=dict_raise_error_on_duplicate_keys)
        if not isinstance(cfg, dict):
            raise TypeError(f"config root is a {type(cfg).__name__}, not an object")
        apply_autos(cfg, autos or {})
        dist = ds_config.dist  # deepspeed.comm; without a process group it would say world size 1
        with mock.patch.object(dist, "get_world_size", lambda *a, **k: world_size), \
             mock.patch.object(dist, "get_rank", lambda *a, **k: 0), \
             mock.patch.object(ds_logger, "disabled", True), \
             contextlib.redirect_stdout(sys.stderr):
            return to_schema(ds_config.DeepSpeedConfig(cfg))
    except Exception as e:  # hjson, assertion, pydantic, DeepSpeedConfigError, ...
        return {"error": f"{type(e).__name__}: {e}"}


def parse_auto(text):
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, json.loads(value)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--auto", type=parse_auto, action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    print(json.dumps(resolve(args.config, args.world_size, dict(args.auto)), indent=1))


if __name__ == "__main__":
    main()
