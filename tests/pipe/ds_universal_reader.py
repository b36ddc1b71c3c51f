"""DeepSpeed's own universal-checkpoint reader on a folder of ours, on CPU: each tensor-parallel
rank's shard of every parameter as deepspeed.checkpoint.universal_checkpoint's
load_hp_checkpoint_state cuts it (cat_dim, param_n_sub_params), for a parameter of the shard's
shape whose whole fragment this rank owns."""
import os
import types

import torch
from deepspeed.checkpoint.universal_checkpoint import load_hp_checkpoint_state


class _Address:
    def __init__(self, numel):
        self.start, self.numel = 0, numel


class _Mapping:
    def __init__(self, dst):
        self.dst, self.optim_fragment = dst, {}
        self.lp_fragment_address = _Address(dst.numel())

    def get_hp_fragment(self):
        return self.dst


def ds_shard(tag_dir, name, shape, tp_rank, tp_world_size):
    """(fp32 shard, {state: shard}) DeepSpeed's reader gives rank tp_rank of tp_world_size."""
    param = torch.nn.Parameter(torch.zeros(shape))
    dst = torch.zeros(param.numel())
    param._hp_mapping = _Mapping(dst)
    param.load_hp_checkpoint_state = types.MethodType(load_hp_checkpoint_state, param)
    param.load_hp_checkpoint_state(os.path.join(tag_dir, "zero", name), tp_rank, tp_world_size)
    return dst.view(shape), {k: v.view(shape) for k, v in param._hp_mapping.optim_fragment.items()}
