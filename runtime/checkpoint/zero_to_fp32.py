#!/usr/bin/env python3
"""Consolidates a dscpp checkpoint into one fp32 state_dict, as DeepSpeed's zero_to_fp32.py
does for DeepSpeed's. dscpp writes this script into every checkpoint folder it saves to; it
needs only torch (no dscpp, no DeepSpeed) and reads ZeRO stages 0-3 of any number of ranks, and
pipeline checkpoints (layer files and one model-states file per stage; a stage with expert
parallelism keeps its module in its model states and its experts in per-expert files) of any
layout, MoE ones (per-expert files) of any expert-parallel degree, and
tensor-parallel ones (mp_rank_XX per tensor rank, a 3D pipeline's per stage and tensor rank):
each split tensor merged over its tensor ranks by the dscpp_partition metadata.

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
        for g, shapes in enumerate(groups):
            fp32.update(_flat_group(parts, g, shapes, folder))
    return fp32


def _flat_group(parts, g, shapes, folder):
    """Group g of ZeRO 1-3 partitions (parts: the files' optimizer_state_dicts, partition
    order). Stages 1-2: one flat buffer in param_shapes' order, partition r holding
    [r*P, (r+1)*P) without the padding past the end, so the files end to end are the buffer."""
    if "fp32_flat_groups" in parts[0]:
        # Stage 3, each parameter alone: partition r holds elements [r*c, (r+1)*c),
        # c = ceil(n/W), padded to c, the parameters' slices end to end in every file.
        flats = [p["fp32_flat_groups"][g].float().flatten() for p in parts]
        fp32, at, world = {}, 0, len(parts)
        for name, shape in shapes.items():
            n = math.prod(shape)
            c = -(-n // world)
            if at + c > flats[0].numel():
                raise ValueError(f"'{folder}': the partitions hold {flats[0].numel()} elements, "
                                 "fewer than param_shapes needs")
            fp32[name] = torch.cat([f[at:at + c] for f in flats])[:n].view(shape).clone()
            at += c
        return fp32
    key = "single_partition_of_fp32_groups"
    flat = torch.cat([p[key][g].float().flatten() for p in parts])
    numels = [math.prod(s) for s in shapes.values()]
    paddings = (parts[0].get("param_alignment_paddings") or [[0] * len(numels)] * (g + 1))[g]
    fp32, at = {}, 0
    for (name, shape), n, pad in zip(shapes.items(), numels, paddings):
        if at + n > flat.numel():
            raise ValueError(f"'{folder}': the partitions hold {flat.numel()} elements, "
                             "fewer than param_shapes needs")
        fp32[name] = flat[at:at + n].view(shape).clone()
        at += n + pad
    return fp32


def _moe_ep_state_dict(folder, model_path, model, mp=0, zero_file=None):
    """A MoE checkpoint saved at ep_size E > 1 (dscpp's runtime/checkpoint/moe_relayout.h):
    param_shapes[:-1] the dense parameters (one group, or Muon's two halves), partitioned over
    the data ranks (those groups of every ZeRO file); param_shapes[-1] expert-parallel rank 0's
    local expert names (every rank's are alike), rank R's experts being the last group of the
    files of data ranks R, R+E, ... (its expert-data group; stage 3: each group's partitions per
    parameter). Stage 0: the dense fp32 copies in the model states' optimizer, rank R's
    experts' after them in expp_rank_R's. Gives the one-rank model's names. mp: the files'
    mp_rank_XX (a pipeline stage's); zero_file(r): data rank r's ZeRO file."""
    zero_file = zero_file or (lambda r: _zero_file(folder, r))
    info, world = model["dscpp_moe"], model["dp_world_size"]
    ep, experts = info["ep_size"], info["expert_params"]
    *dense_groups, expert_shapes = model["param_shapes"]
    dense_shapes = {k: v for g in dense_groups for k, v in g.items()}  # (in the groups' order)
    out = _module_with_experts(folder, model_path, model, mp)  # every global expert, from its file
    for k, t in list(out.items()):
        if torch.is_tensor(t) and t.is_floating_point():
            out[k] = t.float()
    per_rank = []
    if model["optimizer"] is not None:
        masters = model["optimizer"].get("dscpp_fp32_params")
        if masters is None:  # fp32 training: the module and the expert files are the weights
            return out
        out.update((name, t.float()) for name, t in zip(dense_shapes, masters))
        for r in range(ep):
            path = os.path.join(folder, f"expp_rank_{r}_mp_rank_{mp:02d}_optim_states.pt")
            masters = _load(path)["optimizer"]["dscpp_fp32_params"][len(dense_shapes):]
            per_rank.append({name: t.float() for name, t in zip(expert_shapes, masters)})
    else:
        parts = []
        for r in range(world):
            path = zero_file(r)
            f = _load(path)
            _check_binding(model, model_path, f, path, r)
            parts.append(f["optimizer_state_dict"])
        for g, shapes in enumerate(dense_groups):
            out.update(_flat_group(parts, g, shapes, folder))
        for r in range(ep):
            per_rank.append(_flat_group(parts[r::ep], len(dense_groups), expert_shapes, folder))
    # Local names to the one-rank model's: a clone's local id j of rank r is global r * n + j;
    # a stacked weight's ranks end to end on dim 0.
    for name, e in experts.items():
        n, j = e["num_local_experts"], e["local_expert"]
        if j < 0:
            out[name] = torch.cat([per_rank[r][name] for r in range(ep)])
            continue
        local = f"deepspeed_experts.{j}."
        head, _, tail = name.rpartition(local)
        for r in range(ep):
            out[f"{head}deepspeed_experts.{r * n + j}.{tail}"] = per_rank[r][name]
    for alias, name in (model.get("shared_params") or {}).items():
        if name in out:
            out[alias] = out[name]
    return out


def _merge(shards, part):
    """One tensor's shards (tensor-rank order) as the logical tensor (dscpp's tp_reshape.h):
    replicated: shards[0]; fused parts (sub_param_sizes, QKV) each cut evenly on its own."""
    if part is None or part.get("partition_dim") is None or len(shards) == 1:
        return shards[0]
    dim, t = part["partition_dim"], len(shards)
    subs = part.get("sub_param_sizes") or []
    if not subs:
        return torch.cat(shards, dim)
    pieces = [torch.split(s, [n // t for n in subs], dim) for s in shards]
    return torch.cat([pieces[r][j] for j in range(len(subs)) for r in range(t)], dim)


def _mp_zero_file(folder, r, mp, what):
    for prefix in ("", "bf16_"):
        p = os.path.join(folder, f"{prefix}zero_pp_rank_{r}_mp_rank_{mp:02d}_optim_states.pt")
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(f"'{folder}' has no ZeRO partition file of {what}, data rank {r}")


def _pipe_state_dict(folder, model0_path, model0):
    """A pipeline checkpoint (dscpp's pipe/pipeline_checkpoint.cpp): the module from every
    stage's layer files (by layer index, a tied module's first file), the trainable parameters
    from each stage's partitions (zero_pp_rank_D_mp_rank_<stage * t + model>), split tensors
    merged over the t model ranks. A stage with expert parallelism (DeepSpeed's MoE layout: no
    layer files) is read as a MoE checkpoint of its own mp_rank."""
    stages = model0["dscpp_pipe"]["stages"]
    t = model0["dscpp_pipe"].get("model_parallel_size", 1)
    parts, sds = {}, []
    for s in range(stages):
        models, layers = [], []
        for m in range(t):
            path = os.path.join(folder, f"mp_rank_{s * t + m:02d}_model_states.pt")
            ms = model0 if s == 0 and m == 0 else _load(path)
            if ms.get("dscpp_save_id") != model0.get("dscpp_save_id"):
                raise ValueError(f"'{path}' and '{model0_path}' are not of one save")
            models.append((path, ms))
            layers.append(ms["dscpp_pipe"]["layers"])
            parts.update((ms.get("dscpp_tensor_parallel") or {}).get("partitions", {}))
        shard_modules, shard_fp32 = [], []
        for m, (path, ms) in enumerate(models):
            if "num_experts" in ms and (ms.get("dscpp_moe") or {}).get("ep_size", 1) > 1:
                # A stage (and tensor rank) at ep_size > 1: its MoE layout under its mp_rank; the
                # experts, replicas over the tensor ranks, hold no partition (tensor rank 0's kept).
                sd = _moe_ep_state_dict(folder, path, ms, s * t + m, lambda r, mp=s * t + m: _mp_zero_file(
                    folder, r, mp, f"stage {s}, model rank {mp % t}"))
                shard_modules.append(sd)
                shard_fp32.append(sd)
                continue
            module = collections.OrderedDict()
            for layer in layers[m]:
                for key, v in _load(os.path.join(folder, layer["file"])).items():
                    module.setdefault(layer["prefix"] + "." + key, v)
            shard_modules.append(module)
            shard_fp32.append(_trainable_fp32(ms, path, folder, lambda r, mp=s * t + m: _mp_zero_file(
                folder, r, mp, f"stage {s}, model rank {mp % t}")))
        sds.append((layers[0], shard_modules, shard_fp32))
    # By global layer index, each name's first holder (a tied module's owner stage).
    order = sorted(((e["index"], s, e) for s, (ls, _, _) in enumerate(sds) for e in ls),
                   key=lambda x: x[0])
    out = collections.OrderedDict()
    for _, s, e in order:
        _, modules, fp32s = sds[s]
        for name in modules[0]:
            if name in out or not name.startswith(e["prefix"] + "."):
                continue
            src = fp32s if name in fp32s[0] else modules
            v = _merge([x[name] for x in src], parts.get(name))
            out[name] = v.float() if v.is_floating_point() else v
    return out


def _tp_state_dict(folder, model0_path, model0):
    """A tensor-parallel checkpoint of the plain engine: every tensor rank's mp_rank_XX state
    dict, split tensors merged over the ranks. A MoE one keeps each tensor rank's experts in its
    layer_L_expert_E_mp_rank_XX files (replicated over the tensor ranks: no partition)."""
    info = model0["dscpp_tensor_parallel"]
    t, parts = info["tp_degree"], info["partitions"]
    sds = []
    for r in range(t):
        path = os.path.join(folder, f"mp_rank_{r:02d}_model_states.pt")
        m = model0 if r == 0 else _load(path)
        if m.get("dscpp_save_id") != model0.get("dscpp_save_id"):
            raise ValueError(f"'{path}' and '{model0_path}' are not of one save")
        sds.append(_model_file_state_dict(folder, path, m, r, lambda d, r=r: _mp_zero_file(
            folder, d, r, f"tensor rank {r}")))
    return collections.OrderedDict((name, _merge([sd[name] for sd in sds], parts.get(name)))
                                   for name in sds[0])


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
    if "dscpp_tensor_parallel" in model:
        return _tp_state_dict(folder, model_path, model)
    return _model_file_state_dict(folder, model_path, model, 0, lambda r: _zero_file(folder, r))


def _model_file_state_dict(folder, model_path, model, mp, zero_file):
    """One model-states file's state dict, a MoE one's with every global expert (its files of
    mp_rank_<mp>) as the one-rank model names them; zero_file(r): its data rank r's partition."""
    if "num_experts" in model and (model.get("dscpp_moe") or {}).get("ep_size", 1) > 1:
        return _moe_ep_state_dict(folder, model_path, model, mp, zero_file)
    if "num_experts" in model:
        model = dict(model)
        model["module"] = _module_with_experts(folder, model_path, model, mp)
    return _plain_state_dict(model, model_path, folder, zero_file)


def _module_with_experts(folder, model_path, model, mp=0):
    """A MoE checkpoint's module with every global expert, as the one-rank model names them:
    clones as saved (deepspeed_experts.<E>), stacked weights (<name>.<E>) stacked on dim 0."""
    module = collections.OrderedDict(model["module"])
    stacked = collections.defaultdict(dict)
    for layer, count in enumerate(model["num_experts"]):
        for e in range(count):
            path = os.path.join(folder, f"layer_{layer}_expert_{e}_mp_rank_{mp:02d}_model_states.pt")
            if not os.path.isfile(path):
                raise SystemExit(f"zero_to_fp32.py: '{model_path}' names {count} experts in MoE layer "
                                 f"{layer}, but '{path}' is missing")
            for key, t in _load(path).items():
                head, _, tail = key.rpartition(".")
                if "deepspeed_experts." not in key and tail == str(e):
                    stacked[head][e] = t
                else:
                    module[key] = t
    for name, parts in stacked.items():
        module[name] = torch.stack([parts[e] for e in sorted(parts)])
    return module


def _plain_state_dict(model, model_path, folder, zero_file):
    """One model-states file's state dict (zero_file(r): its data rank r's partition)."""
    module = model["module"]
    groups = model["param_shapes"]
    fp32 = _trainable_fp32(model, model_path, folder, zero_file)
    out = collections.OrderedDict()
    if any(name not in module for name in fp32):  # stage 3: no partitioned parameter in module
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
