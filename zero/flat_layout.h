// Where every parameter lives in ZeRO's flat buffer, and who owns what. Parameters are laid
// out in the order backward makes their gradients ready (as first seen; before that, reverse
// registration order, the usual guess), in buckets of about reduce_bucket_size elements; each
// bucket is padded to a multiple of world_size * alignment and split into world_size equal chunks.
// Rank r owns chunk r of every bucket, so a bucket's gradients are reduce-scattered, and its
// parameters all-gathered, with one collective each; a rank's partition (its fp32 master weights
// and optimizer state) is its chunks laid end to end. With world_size 1 (stage 0) the single
// partition is the whole buffer.
#pragma once

#include <cstdint>
#include <vector>

namespace dscpp::zero {

struct FlatLayout {
  struct Param {
    int64_t offset;  // first element in the flat buffer
    int64_t numel;
    int bucket;  // index into buckets
  };
  struct Bucket {
    int64_t begin, end;       // [begin, end) of the flat buffer, padding included
    int64_t chunk;            // (end - begin) / world_size: one rank's share
    int64_t part_offset;      // where this rank's chunk sits in its partition
    std::vector<int> params;  // indices of the parameters inside
    int group = 0;            // the parameter group all of them belong to
    int unit = 0;             // the gathering unit all of them belong to (see build)
  };
  struct GroupRange {
    int64_t part_begin, part_end;  // the group's chunks in a rank's partition (contiguous)
  };
  std::vector<Param> params;    // in registration order
  std::vector<Bucket> buckets;  // in buffer order = the order backward fills them
  int64_t total = 0;            // elements of the flat buffer, padding included
  int64_t partition = 0;        // elements of each rank's partition
  int world_size = 1;
  std::vector<GroupRange> groups;  // one per parameter group

  // numels: in registration order. alignment: elements (a chunk starts at a multiple).
  // group_of: each parameter's group (empty: one group). Groups are laid out one after the
  // other, and no bucket holds two groups, so a group's chunks are contiguous in every
  // partition and one optimizer shard with the group's settings covers them.
  //
  // unit_of (stage 3 by layer; empty: one unit): each parameter's gathering unit, for
  // instance the first layer that uses it, or -1. No bucket holds two units either, so a
  // unit is gathered bucket by bucket without fetching any other. Within a group, buckets go
  // by unit from the highest down (the order backward reaches layers) with -1 last, and
  // within a unit in `ready_order`.
  //
  // ready_order: every parameter index once, in the order backward made the gradients ready
  // (GradBuckets::ready_order); empty: reverse registration order.
  static FlatLayout build(const std::vector<int64_t>& numels, int world_size, int64_t bucket_size,
                          int64_t alignment, const std::vector<int>& group_of = {},
                          const std::vector<int>& unit_of = {},
                          const std::vector<int>& ready_order = {});
  // The same, but every parameter whole in one rank's chunk ("whole matrices": Muon
  // orthogonalises each matrix whole, so one rank must hold all of it). Each parameter gets an
  // owner: by its cost (Newton-Schulz's flops, say), largest first, to the rank with the least
  // cost so far (the lowest on a tie). A bucket takes, from each rank, that rank's next
  // parameters in the order above (group, unit, ready order) up to bucket_size / world_size
  // elements (at least one); its chunk is the largest rank's share rounded up to alignment,
  // and rank r's parameters lie end to end from the start of chunk r, padding after them. A
  // rank's partition then holds its parameters whole, and a bucket's reduce-scatter gives
  // each owner the reduced gradients of its own parameters.
  static FlatLayout build_whole(const std::vector<int64_t>& numels, int world_size,
                                int64_t bucket_size, int64_t alignment,
                                const std::vector<double>& cost,
                                const std::vector<int>& group_of = {},
                                const std::vector<int>& unit_of = {},
                                const std::vector<int>& ready_order = {});
  // The rank whose chunk holds parameter i (its whole elements, in a build_whole layout).
  int owner_of(int i) const;
  // Whether two layouts place every parameter and bucket alike.
  bool same_placement(const FlatLayout& other) const;
};

}  // namespace dscpp::zero
