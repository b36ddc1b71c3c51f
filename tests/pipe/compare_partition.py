#!/usr/bin/env python3
"""dscpp's stage partitioning against DeepSpeed's own PipelineModule._partition_layers.

    compare_partition.py --cli PATH/TO/partition_cli [--cases N] [--seed S]

Builds N random layer lists (random type names from a small vocabulary, random trainable
and frozen parameter counts, 1..24 layers, 1..10 stages, so that more stages than layers
occur), partitions each with DeepSpeed (uniform, parameters, and type:REGEX methods, the
latter with regexes that match some, all or no layers) and with our partition_cli, and
compares the boundaries, or that both refuse. Exits 1 on any difference.
"""
import argparse
import os
import random
import subprocess
import sys
import types

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402
from torch import nn  # noqa: E402
from deepspeed.runtime.pipe.module import LayerSpec, PipelineModule  # noqa: E402

NAMES = ["Embedding", "TransformerLayer", "ParallelTransformerLayer", "LayerNorm", "Linear", "Head", "MLP"]
# Regexes as users write them; the last ones match nothing in NAMES.
REGEXES = ["transformer", "Transformer", "TRANSFORMERLAYER", "^Embedding$", "layer", "norm|head", "^p", ".",
           "mlp", "transformer:ignored", "nothing", "^layer"]
METHODS_FIXED = ["uniform", "parameters", "Parameters", "UNIFORM"]

_classes = {}


def layer_class(name):
    """An nn.Module subclass named `name` holding a trainable and a frozen parameter."""
    if name not in _classes:
        def init(self, trainable, frozen):
            nn.Module.__init__(self)
            self.w = nn.Parameter(torch.zeros(trainable)) if trainable else None
            self.f = nn.Parameter(torch.zeros(frozen), requires_grad=False) if frozen else None
        _classes[name] = type(name, (nn.Module,), {"__init__": init})
    return _classes[name]


class Stub:
    """What _partition_layers reads of a PipelineModule, and DeepSpeed's own helpers."""

    def __init__(self, specs, stages):
        self._layer_specs = specs
        self.num_stages = stages
        self.global_rank = 1  # not 0: no printing
        self._topo = types.SimpleNamespace(get_coord=lambda rank: types.SimpleNamespace(pipe=0))
        self.loss_fn = None

    def _set_bounds(self, start, stop):
        pass

    _count_layer_params = PipelineModule._count_layer_params
    _find_layer_type = PipelineModule._find_layer_type


def deepspeed_parts(method, layers, stages):
    specs = [LayerSpec(layer_class(name), trainable, frozen) for name, trainable, frozen in layers]
    stub = Stub(specs, stages)
    try:
        PipelineModule._partition_layers(stub, method)
    except (RuntimeError, NotImplementedError) as e:
        return "error", str(e)
    return [int(x) for x in stub.parts], None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = []
    for _ in range(args.cases):
        n = rng.randint(1, 24)
        stages = rng.randint(1, 10)
        # Weights from a few scales, with ties (equal counts) and zero-parameter layers.
        layers = [(rng.choice(NAMES), rng.choice([0, 1, 7, 64, 64, 100, rng.randint(0, 5000)]), rng.randint(0, 3) * 10)
                  for _ in range(n)]
        methods = METHODS_FIXED[:2] + [rng.choice(METHODS_FIXED), "type:" + rng.choice(REGEXES), "type:" +
                                       rng.choice(REGEXES), "profile"]
        for method in methods:
            cases.append((method, stages, layers))
    lines = [f"{method} {stages} {len(layers)} " + " ".join(f"{name} {trainable}" for name, trainable, _ in layers)
             for method, stages, layers in cases]
    out = subprocess.run([args.cli], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
    ours = out.stdout.splitlines()
    assert len(ours) == len(cases), (len(ours), len(cases))
    failed = refused = 0
    for (method, stages, layers), line, got in zip(cases, lines, ours):
        want, message = deepspeed_parts(method, layers, stages)
        if want == "error":
            refused += 1
            ok = got.startswith("error: ")
        else:
            ok = got == " ".join(map(str, want))
        if not ok:
            failed += 1
            print(f"FAIL: {line}\n  deepspeed: {want} {message or ''}\n  dscpp:     {got}")
    print(f"{len(cases) - failed} of {len(cases)} cases agree with DeepSpeed ({refused} refused by both or "
          f"expected so)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
