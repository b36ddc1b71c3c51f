#!/usr/bin/env python3
"""tests/runtime/engine/ds_train.py (DeepSpeed trains engine_train's MLP on CPU) with one more
flag: `--load-universal` sets `checkpoint: {load_universal: true}` in its ds_config, so that
`--load DIR` resumes from the universal checkpoint DIR/latest_universal names.

    dscpp --num_gpus 4 --no_local_rank python ds_train_universal.py --load-universal \
        --init init.json --stage 2 --ga 2 --steps 20 --load ckpt --out out.json"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engine"))
import ds_train  # noqa: E402

if __name__ == "__main__":
    if "--load-universal" in sys.argv:
        sys.argv.remove("--load-universal")
        plain = ds_train.config
        ds_train.config = lambda stage, ga, muon=None: {**plain(stage, ga, muon), "checkpoint": {"load_universal": True}}
    ds_train.main()
