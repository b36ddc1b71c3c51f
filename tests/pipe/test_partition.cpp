// pipe/partition.h by hand; compare_partition.py checks it against DeepSpeed's own code.
#include <gtest/gtest.h>

#include "dscpp/pipe/partition.h"

namespace dscpp::pipe {
namespace {

using V = std::vector<int>;

TEST(Partition, UniformGivesTheFirstStagesTheRemainder) {
  EXPECT_EQ(partition_uniform(10, 4), (V{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(8, 4), (V{0, 2, 4, 6, 8}));
  EXPECT_EQ(partition_uniform(2, 4), (V{0, 1, 2, 2, 2}));  // more stages than layers: empty tail
}

TEST(Partition, BalancedMinimisesTheSpreadOfTheParts) {
  EXPECT_EQ(partition_balanced({1, 1, 1, 1}, 2), (V{0, 2, 4}));
  EXPECT_EQ(partition_balanced({100, 1, 1, 1, 1, 100}, 2), (V{0, 3, 6}));
  EXPECT_EQ(partition_balanced({100, 1, 1, 1, 1, 100}, 3), (V{0, 1, 5, 6}));
}

TEST(Partition, MethodsAsDeepSpeedNamesThem) {
  const std::vector<LayerInfo> layers{{"Embedding", 1000},      {"TransformerLayer", 10},
                                      {"TransformerLayer", 10}, {"TransformerLayer", 10},
                                      {"TransformerLayer", 10}, {"Head", 0}};
  EXPECT_EQ(partition_layers("uniform", layers, 2), (V{0, 3, 6}));
  EXPECT_EQ(partition_layers("parameters", layers, 2), (V{0, 1, 6}));
  // Only the four transformer layers weigh: two per stage, the embedding before, the head after.
  EXPECT_EQ(partition_layers("type:transformer", layers, 2), (V{0, 3, 6}));
  EXPECT_EQ(partition_layers("TYPE:^TRANS", layers, 4), (V{0, 2, 3, 4, 6}));
  EXPECT_THROW(partition_layers("type:attention", layers, 2), PartitionError);
  EXPECT_THROW(partition_layers("type:(", layers, 2), PartitionError);
  EXPECT_THROW(partition_layers("profile", layers, 2), PartitionError);
  EXPECT_THROW(partition_layers("uniform", layers, 0), PartitionError);
}

}  // namespace
}  // namespace dscpp::pipe
