"""dscpp's expert groups (comm/expert_groups.h) against DeepSpeed's own group code, evaluated
here: deepspeed.utils.groups._get_expert_parallel_ranks (expert x model x data, the path with
tensor parallelism) for every (tensor, pipe, ep) layout of worlds 8 and 16, and, with no
tensor parallelism, _create_expert_and_data_parallel's legacy path run against a mock
torch.distributed that records the groups it is asked to make. Also: an ep_size that does
not divide the data axis is refused by name.

usage: compare_expert_groups_with_deepspeed.py EXPERT_GROUPS_CLI
"""
import json
import subprocess
import sys

import deepspeed.utils.groups as groups


def dscpp_groups(cli, layouts):
    """One run of the CLI for every layout (world, t, p, ep): a JSON object each."""
    args = [str(x) for layout in layouts for x in layout]
    out = subprocess.run([cli] + args, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


class MockDist:
    """What _create_expert_and_data_parallel asks of deepspeed.comm."""

    def __init__(self, world, rank):
        self.world, self.rank, self.made = world, rank, []

    def is_initialized(self):
        return True

    def get_world_size(self, group=None):
        return self.world

    def get_rank(self, group=None):
        return self.rank

    def new_group(self, ranks):
        self.made.append(list(ranks))
        return tuple(ranks)


def legacy_groups(world, p, ep):
    """All groups the legacy path makes (every rank makes all), split into ep / edp by the
    dictionaries it fills on each rank."""
    ep_groups, edp_groups = set(), set()
    real_dist = groups.dist
    try:
        for rank in range(world):
            groups.dist = MockDist(world, rank)
            groups._EXPERT_PARALLEL_GROUP.clear()
            groups._EXPERT_DATA_PARALLEL_GROUP.clear()
            groups._EXPERT_PARALLEL_GROUP_RANKS.clear()
            groups._EXPERT_DATA_PARALLEL_GROUP_RANKS.clear()
            groups._create_expert_and_data_parallel(ep, pp_size=p)
            name = f"ep_size_{ep}"
            ep_groups.add(tuple(groups._EXPERT_PARALLEL_GROUP_RANKS[name]))
            edp_groups.add(tuple(groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name]))
    finally:
        groups.dist = real_dist
    return sorted(ep_groups), sorted(edp_groups)


def as_sorted(lists):
    return sorted(tuple(g) for g in lists)


def main():
    cli = sys.argv[1]
    layouts = []
    for world in (8, 16):
        for t in (1, 2, 4, 8):
            for p in (1, 2, 4):
                if world % (t * p):
                    continue
                d = world // (t * p)
                for ep in (1, 2, 4, 8, 16):
                    if ep > d or d % ep:
                        continue
                    layouts.append((world, t, p, ep))
    layouts.append((8, 2, 1, 3))  # ep 3 on a data axis of 4: refused
    results = dscpp_groups(cli, layouts)
    assert len(results) == len(layouts), results
    checked = 0
    for (world, t, p, ep), got in zip(layouts[:-1], results[:-1]):
        want_ep, want_edp = groups._get_expert_parallel_ranks(world, t, ep, p)
        layout = f"world {world} t {t} p {p} ep {ep}"
        assert as_sorted(got["ep"]) == as_sorted(want_ep), (layout, got, want_ep)
        assert as_sorted(got["edp"]) == as_sorted(want_edp), (layout, got, want_edp)
        if t == 1:
            lep, ledp = legacy_groups(world, p, ep)
            assert as_sorted(got["ep"]) == lep, (layout, "legacy", got, lep)
            assert as_sorted(got["edp"]) == ledp, (layout, "legacy", got, ledp)
        print(f"{layout}: ep {got['ep']} edp {got['edp']}")
        checked += 1
    bad = results[-1]
    assert "ep_size 3 must divide the data-parallel size 4" in bad.get("error", ""), bad
    print(f"{checked} layouts equal DeepSpeed's groups; ep 3 on data 4 refused: {bad['error']}")


if __name__ == "__main__":
    main()
