// tp_reshape.h against nn::partition_of (the slicing the parallel layers initialise with, an
// independent implementation): every rank's shard at t in {1, 2, 4} for contiguous (stride 1)
// and fused (stride 3, QKV) tensors along dims 0 and 1, the merge back to the logical tensor,
// a reshape 2 -> 4 -> 1, uneven partition_sizes, the metadata written and read back as
// dscpp_partition, and shapes that do not fit it as CheckpointErrors naming the tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/nn/parallel_weight_init.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"

namespace ck = dscpp::checkpoint;

namespace {

TEST(TpReshape, ShardsAreTheLayersSlicesAndMergeBack) {
  const at::Tensor whole = at::arange(24 * 6, at::kFloat).reshape({24, 6});
  for (int64_t stride : {1, 3}) {
    for (int64_t dim : {0, 1}) {
      if (dim == 1 && stride == 3) continue;  // 6 columns do not split in 3 x 4
      for (int64_t t : {1, 2}) {
        const auto p = ck::tensor_parallel_partition({24, 6}, t, dim, stride);
        std::vector<at::Tensor> shards;
        for (int64_t r = 0; r < t; ++r) {
          shards.push_back(ck::tp_shard(whole, p, r, "w"));
          EXPECT_TRUE(at::equal(shards.back(),
                                dscpp::nn::partition_of(whole, dim, stride, static_cast<int>(r),
                                                        static_cast<int>(t))))
              << "stride " << stride << " dim " << dim << " t " << t << " rank " << r;
        }
        EXPECT_TRUE(at::equal(ck::merge_tp_shards(shards, p, "w"), whole));
      }
    }
  }
  // Stride 3 over 4 ranks along dim 0 (24 rows = 3 x 8: 2 rows of each part per rank).
  const auto p4 = ck::tensor_parallel_partition({24, 6}, 4, 0, 3);
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(
        at::equal(ck::tp_shard(whole, p4, r, "qkv"), dscpp::nn::partition_of(whole, 0, 3, r, 4)));
}

TEST(TpReshape, ReshapesAcrossDegrees) {
  const at::Tensor whole = at::randn({12, 8});
  const auto p2 = ck::tensor_parallel_partition({12, 8}, 2, 0, 3);
  std::vector<at::Tensor> at2 = {ck::tp_shard(whole, p2, 0, "w"), ck::tp_shard(whole, p2, 1, "w")};
  const auto at4 = ck::reshape_tp_shards(at2, p2, 4, "w");
  ASSERT_EQ(at4.size(), 4u);
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(at::equal(at4[r], dscpp::nn::partition_of(whole, 0, 3, r, 4)));
  const auto at1 = ck::reshape_tp_shards(at4, ck::at_tp_degree(p2, 4), 1, "w");
  EXPECT_TRUE(at::equal(at1.at(0), whole));
  // Replicated: every rank's copy is the tensor.
  const auto rep = ck::tensor_parallel_partition({12, 8}, 2, std::nullopt);
  const auto rep4 = ck::reshape_tp_shards({whole, whole}, rep, 4, "ln");
  for (const auto& s : rep4) EXPECT_TRUE(at::equal(s, whole));
}

TEST(TpReshape, UnevenPartitionSizesAndMetadataRoundTrip) {
  const at::Tensor whole = at::arange(10, at::kFloat);
  auto p = ck::tensor_parallel_partition({10}, 2, 0);
  p.partition_sizes = {6, 4};
  EXPECT_TRUE(at::equal(ck::tp_shard(whole, p, 1, "v"), whole.narrow(0, 6, 4)));
  const auto back = ck::ParamPartition::from_py(p.to_py(), "v");
  EXPECT_EQ(back.partition_sizes, p.partition_sizes);
  EXPECT_EQ(back.tp_degree, 2);
  const auto q =
      ck::ParamPartition::from_py(ck::tensor_parallel_partition({24, 6}, 2, 0, 3).to_py(), "qkv");
  EXPECT_EQ(q.sub_param_sizes, (std::vector<int64_t>{8, 8, 8}));
  EXPECT_EQ(*q.partition_dim, 0);
}

TEST(TpReshape, ShapesThatDoNotFitAreErrorsNamingTheTensor) {
  const auto p = ck::tensor_parallel_partition({24, 6}, 2, 0);
  try {
    ck::merge_tp_shards({at::zeros({12, 6}), at::zeros({11, 6})}, p, "blocks.0.mlp.fc.weight");
    ADD_FAILURE() << "no error";
  } catch (const ck::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.mlp.fc.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(
      ck::tp_shard(at::zeros({24, 6}), ck::tensor_parallel_partition({24, 6}, 5, 0), 0, "w"),
      ck::CheckpointError);
  EXPECT_THROW(ck::merge_tp_shards({at::zeros({24, 6})}, p, "w"), ck::CheckpointError);
}

}  // namespace
