#!/usr/bin/env python3
"""Consolidates a dscpp checkpoint into one fp32 state_dict, as DeepSpeed's zero_to_fp32.py
does for DeepSpeed's. dscpp writes this script into every checkpoint folder it saves to; it
needs only torch (no dscpp, no DeepSpeed) and reads ZeRO stages 0-3 of any number of ranks, and
pipeline checkpoints (layer files and one model-states file per stage) of any layout.

    python zero_to_fp32.py CHECKPOINT_DIR OUTPUT [-t TAG]

CHECKPOINT_DIR is the folder holding `latest`; OUTPUT a file, or a folder (then
OUTPUT/pytorch_model.bin). The result opens with torch.load: the module's state_dict names
and shapes, fp32 values (the master weights, not the 16-bit copies), buffers as float, shared
parameters under each of their names. From Python:
get_fp32_state_dict_from_zero_checkpoint(CHECKPOINT_DIR, tag=None)."""
import argparse
import collections
import math
import os

import torch


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _zero_file(folder, rank):
    for prefix in ("", "bf16_"):
        path = os.path.join(folder, f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"'{folder}' has no ZeRO partition file of rank {rank}")


def _check_binding(model, model_path, part, part_path, rank):
    """The files of one save carry its save id (dscpp's runtime/checkpoint/save_binding.h)."""
    if "dscpp_save_id" not in model:
        return
    for key, want in (("dscpp_save_id", model["dscpp_save_id"]), ("dscpp_rank", rank),
                      ("dscpp_world_size", model.get("dscpp_world_size")),
                      ("dscpp_global_steps", model.get("dscpp_global_steps"))):
        if part.get(key) != want:
            raise ValueError(f"'{part_path}' has {key} {part.get(key)!r}, but '{model_path}' (rank {rank}'s "
                             f"partition) needs {want!r}: its files are not of one save")


def _trainable_fp32(model, model_path, folder, zero_file):
    """The fp32 values of one model-states file's trainable parameters (param_shapes), from its
    partitions (zero_file(r): rank r's) or, at stage 0, its dscpp_fp32_params (none: {})."""
    groups = model["param_shapes"]
    fp32 = {}
    if model["optimizer"] is not None:
        # Stage 0: the module holds the weights; under fp16/bf16 the fp32 copies sit beside the
        # optimizer state, in param_shapes' order.
        masters = model["optimizer"].get("dscpp_fp32_params")
        if masters is not None:
            for name, t in zip(groups[0].keys(), masters):
                fp32[name] = t.float()
    else:
        world = model["dp_world_size"]
        parts = []
        for r in range(world):
            path = zero_file(r)
            f = _load(path)
            _check_binding(model, model_path, f, path, r)
            parts.append(f["optimizer_state_dict"])
        stage3 = "fp32_flat_groups" in parts[0]
        key = "fp32_flat_groups" if stage3 else "single_partition_of_fp32_groups"
        for g, shapes in enumerate(groups):
            flats = [p[key][g].float().flatten() for p in parts]
            numels = [math.prod(s) for s in shapes.values()]
            if stage3:
                # Each parameter alone: rank r holds elements [r*c, (r+1)*c), c = ceil(n/W),
                # padded to c, the parameters' slices end to end in every file.
                at = 0
                for (name, shape), n in zip(shapes.items(), numels):
                    c = -(-n // world)
                    fp32[name] = torch.cat([f[at:at + c] for f in flats])[:n].view(shape).clone()
                    at += c
            else:
                # One flat buffer in param_shapes' order, rank r holding [r*P, (r+1)*P) without
                # the padding past the end: the files end to end are the buffer.
                flat = torch.cat(flats)
                paddings = parts[0].get("param_alignment_paddings", [[0] * len(numels)])[g]
                at = 0
                for (name, shape), n, pad in zip(shapes.items(), numels, paddings):
                    if at + n > flat.numel():
                        raise ValueError(f"'{folder}': the partitions hold {flat.numel()} elements, "
                                         "fewer than param_shapes needs")
                    fp32[name] = flat[at:at + n].view(shape).clone()
                    at += n + pad
    return fp32


def _pipe_state_dict(folder, model0_path, model0):
    """A pipeline checkpoint (dscpp's pipe/pipeline_checkpoint.cpp): the module from every
    stage's layer files (by layer index, a tied module's first file), the trainable parameters
    from each stage's partitions (zero_pp_rank_D_mp_rank_<stage>)."""
    stages = model0["dscpp_pipe"]["stages"]
    models, layers = [], []
    for s in range(stages):
        path = os.path.join(folder, f"mp_rank_{s:02d}_model_states.pt")
        m = model0 if s == 0 else _load(path)
        if m.get("dscpp_save_id") != model0.get("dscpp_save_id"):
            raise ValueError(f"'{path}' and '{model0_path}' are not of one save")
        models.append((path, m))
        layers += m["dscpp_pipe"]["layers"]
    module = collections.OrderedDict()
    for layer in sorted(layers, key=lambda e: e["index"]):
        for key, t in _load(os.path.join(folder, layer["file"])).items():
            module.setdefault(layer["prefix"] + "." + key, t)
    fp32 = {}
    for s, (path, m) in enumerate(models):
        def zero_file(r, s=s):
            for prefix in ("", "bf16_"):
                p = os.path.join(folder, f"{prefix}zero_pp_rank_{r}_mp_rank_{s:02d}_optim_states.pt")
                if os.path.isfile(p):
                    return p
            raise FileNotFoundError(f"'{folder}' has no ZeRO partition file of stage {s}, rank {r}")
        for name, t in _trainable_fp32(m, path, folder, zero_file).items():
            fp32.setdefault(name, t)
    return collections.OrderedDict(
        (name, fp32[name] if name in fp32 else (t.float() if t.is_floating_point() else t))
        for name, t in module.items())


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None):
    if tag is None:
        with open(os.path.join(checkpoint_dir, "latest")) as f:
            tag = f.read().strip()
    folder = os.path.join(checkpoint_dir, tag)
    model_path = os.path.join(folder, "mp_rank_00_model_states.pt")
    if not os.path.isfile(model_path):  # stage 3: rank 0's model states
        model_path = os.path.join(folder, "zero_pp_rank_0_mp_rank_00_model_states.pt")
    model = _load(model_path)
    if "dscpp_pipe" in model:
        return _pipe_state_dict(folder, model_path, model)
    module = model["module"]
    groups = model["param_shapes"]
    fp32 = _trainable_fp32(model, model_path, folder, lambda r: _zero_file(folder, r))
    out = collections.OrderedDict()
    if fp32 and next(iter(fp32)) not in module:  # stage 3: no partitioned parameter in module
        for shapes in groups:
            for name in shapes:
                out[name] = fp32[name]
    for name, t in module.items():
        if name in fp32:
            out[name] = fp32[name]
        elif torch.is_tensor(t):
            out[name] = t.float() if t.is_floating_point() else t
    for alias, name in (model.get("shared_params") or {}).items():
        if name in out:
            out[alias] = out[name]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint_dir", help="the folder save_checkpoint wrote (holds 'latest')")
    ap.add_argument("output", help="the output file, or a folder (then OUTPUT/pytorch_model.bin)")
    ap.add_argument("-t", "--tag", default=None, help="the checkpoint tag (default: the one 'latest' names)")
    args = ap.parse_args()
    sd = get_fp32_state_dict_from_zero_checkpoint(args.checkpoint_dir, args.tag)
    out = args.output
    if os.path.isdir(out) or out.endswith(os.sep):
        os.makedirs(out, exist_ok=True)
        out = os.path.join(out, "pytorch_model.bin")
    torch.save(sd, out)
    print(f"zero_to_fp32.py: wrote {len(sd)} tensors ({sum(t.numel() for t in sd.values())} elements) to {out}")


if __name__ == "__main__":
    main()
