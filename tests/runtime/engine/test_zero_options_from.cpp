// The ds_config -> ZeRO options table (runtime/engine/zero_options_from.h) against the key-fate
// table (config/key_fates.cpp): a key the table maps is one key_fates says dscpp acts on, every
// acted-on ZeRO key is mapped (or named below with where it is read), and the options come out
// as the config gives them, the offloads only where they apply.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/config/key_fates.h"
#include "dscpp/runtime/engine/zero_options_from.h"

using dscpp::config::Fate;
using nlohmann::json;

namespace {

bool acted_on(const dscpp::config::KeyFate& f) {
  return f.fate == Fate::kActedOn || f.fate == Fate::kActedUntested;
}

// Acted-on ZeRO keys that set no option: sections (their keys below are mapped), the old
// spellings the config reader reads as offload_*.device, and a key the 16-bit save reads.
const std::set<std::string> kReadElsewhere = {
    "zero_optimization.offload_optimizer",
    "zero_optimization.offload_param",
    "zero_optimization.cpu_offload",
    "zero_optimization.cpu_offload_param",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",  // engine_save_16bit.cpp
};

bool zero_key(const std::string& path) {
  return path.rfind("zero_optimization.", 0) == 0 || path.rfind("aio.", 0) == 0;
}

dscpp::ZeroSettings settings_of(const json& config, dscpp::ZeroJobFacts job = {}) {
  json c = config;  // one rank, one sample per micro-step
  c["train_batch_size"] = c.value("gradient_accumulation_steps", 1);
  return dscpp::zero_options_from(dscpp::parse_ds_config(c), job);
}

}  // namespace

TEST(ZeroOptionsFrom, EveryMappedKeyIsOneKeyFatesActsOn) {
  std::set<std::string> seen;
  for (const auto& row : dscpp::zero_option_keys()) {
    EXPECT_TRUE(seen.insert(row.key).second) << row.key << " is mapped twice";
    const auto* f = dscpp::config::find_key_fate(row.key);
    if (!f) {
      ADD_FAILURE() << row.key << " has no fate in config/key_fates.cpp";
      continue;
    }
    EXPECT_EQ(std::string(f->path), row.key) << "mapped under an alias, not its canonical name";
    EXPECT_TRUE(acted_on(*f)) << row.key << " is mapped, but key_fates does not say it is acted on";
  }
}

TEST(ZeroOptionsFrom, EveryActedOnZeroKeyIsMapped) {
  std::set<std::string> mapped;
  for (const auto& row : dscpp::zero_option_keys()) mapped.insert(row.key);
  for (const auto& f : dscpp::config::key_fates()) {
    const std::string path = f.path;
    if (!acted_on(f) || !zero_key(path)) continue;
    EXPECT_TRUE(mapped.count(path) || kReadElsewhere.count(path))
        << path << " is acted on (key_fates) but sets no ZeRO option in zero_options_from";
  }
  // The exceptions stay true: acted on, and not mapped after all.
  for (const auto& path : kReadElsewhere) {
    const auto* f = dscpp::config::find_key_fate(path);
    EXPECT_TRUE(f && acted_on(*f)) << path;
    EXPECT_EQ(mapped.count(path), 0u) << path << " is mapped: take it off kReadElsewhere";
  }
}

TEST(ZeroOptionsFrom, OptionsTakeTheConfigsValues) {
  const auto s = settings_of({{"gradient_clipping", 0.5},
                              {"prescale_gradients", true},
                              {"gradient_predivide_factor", 2.0},
                              {"communication_data_type", "bf16"},
                              {"gradient_accumulation_steps", 1},
                              {"bf16", {{"enabled", true}, {"check_grad_overflow", false}}},
                              {"zero_optimization",
                               {{"stage", 2},
                                {"reduce_bucket_size", 1234},
                                {"overlap_comm", true},
                                {"reduce_scatter", false},
                                {"dscpp_deferred_allgather", true}}}});
  const auto& z = s.zero;
  EXPECT_EQ(z.stage, 2);
  EXPECT_EQ(z.reduce_bucket_size, 1234);
  EXPECT_TRUE(z.overlap_comm);
  EXPECT_FALSE(z.reduce_scatter);
  EXPECT_TRUE(z.defer_allgather);
  EXPECT_TRUE(z.prescale_gradients);
  EXPECT_EQ(z.gradient_predivide_factor, 2.0);
  EXPECT_EQ(z.communication_data_type, at::kBFloat16);
  EXPECT_EQ(z.gradient_clipping, 0.5);
  EXPECT_FALSE(z.check_overflow);
  EXPECT_EQ(z.grad_dtype, at::kBFloat16) << "bf16 with nothing accumulated";
  EXPECT_FALSE(z.accumulates);
  EXPECT_FALSE(z.offload.enabled);
  EXPECT_FALSE(z.offload_param.enabled);
  // Deferred all-gathers are stages 1-2's; fp16 always checks overflow.
  const auto s3 = settings_of({{"fp16", {{"enabled", true}}},
                               {"gradient_accumulation_steps", 2},
                               {"zero_optimization",
                                {{"stage", 3},
                                 {"dscpp_deferred_allgather", true},
                                 {"stage3_prefetch_bucket_size", 11},
                                 {"stage3_max_live_parameters", 12},
                                 {"stage3_max_reuse_distance", 13},
                                 {"stage3_param_persistence_threshold", 14},
                                 {"stage3_model_persistence_threshold", 15}}}});
  EXPECT_FALSE(s3.zero.defer_allgather);
  EXPECT_TRUE(s3.zero.check_overflow);
  EXPECT_TRUE(s3.zero.accumulates);
  EXPECT_EQ(s3.zero.grad_dtype, at::kFloat) << "two micro-steps accumulate in fp32";
  EXPECT_EQ(s3.layer_gather.prefetch_bucket_size, 11);
  EXPECT_EQ(s3.layer_gather.max_live_parameters, 12);
  EXPECT_EQ(s3.layer_gather.max_reuse_distance, 13);
  EXPECT_EQ(s3.param_persistence_threshold, 14);
  EXPECT_EQ(s3.model_persistence_threshold, 15);
}

TEST(ZeroOptionsFrom, BothNvmeSwappersTakeTheAioSectionAndTheJobsRank) {
  const json config = {{"aio", {{"block_size", 4096}, {"queue_depth", 3}, {"single_submit", true}}},
                       {"zero_optimization",
                        {{"stage", 3},
                         {"sub_group_size", 77},
                         {"offload_optimizer",
                          {{"device", "nvme"},
                           {"nvme_path", "/tmp/a"},
                           {"buffer_count", 6},
                           {"pin_memory", true},
                           {"ratio", 0.5}}},
                         {"offload_param",
                          {{"device", "nvme"},
                           {"nvme_path", "/tmp/b"},
                           {"buffer_count", 7},
                           {"buffer_size", 1000},
                           {"max_in_cpu", 99},
                           {"pin_memory", false}}}}}};
  const auto s = settings_of(config, {3, true});
  const auto& o = s.zero.offload;
  EXPECT_TRUE(o.enabled);
  EXPECT_TRUE(o.pin_memory);
  EXPECT_EQ(o.sub_group_size, 77);
  EXPECT_EQ(o.ratio, 0.5);
  EXPECT_TRUE(o.nvme.enabled);
  EXPECT_EQ(o.nvme.path, "/tmp/a");
  EXPECT_EQ(o.nvme.stage, 3);
  EXPECT_EQ(o.nvme.rank, 3);
  EXPECT_EQ(o.nvme.buffer_count, 6);
  EXPECT_TRUE(o.nvme.pin_memory);
  const auto& p = s.zero.offload_param;
  EXPECT_TRUE(p.enabled);
  EXPECT_FALSE(p.pin_memory);
  EXPECT_EQ(p.buffer_count, 7);
  EXPECT_EQ(p.buffer_size, 1000);
  EXPECT_TRUE(p.nvme.enabled);
  EXPECT_EQ(p.nvme.path, "/tmp/b");
  EXPECT_EQ(p.nvme.rank, 3);
  EXPECT_EQ(p.nvme.buffer_count, 7);
  EXPECT_EQ(p.nvme.buffer_size, 1000);
  EXPECT_EQ(p.nvme.max_in_cpu, 99);
  EXPECT_FALSE(p.nvme.pin_memory);
  for (const auto* aio : {&o.nvme.aio, &p.nvme.aio}) {
    EXPECT_EQ(aio->block_size, 4096);
    EXPECT_EQ(aio->queue_depth, 3);
    EXPECT_TRUE(aio->single_submit);
  }
  // Without a GPU no buffer is page-locked.
  EXPECT_FALSE(settings_of(config, {3, false}).zero.offload.nvme.pin_memory);
}

TEST(ZeroOptionsFrom, OffloadsApplyOnlyAtTheirStages) {
  const json offloads = {{"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}},
                         {"offload_param", {{"device", "cpu"}}}};
  json at2 = offloads;
  at2["stage"] = 2;
  const auto s2 = settings_of({{"zero_optimization", at2}});
  EXPECT_TRUE(s2.zero.offload.enabled);
  EXPECT_EQ(s2.zero.offload.ratio, 1.0) << "partial offload is stage 3's";
  EXPECT_FALSE(s2.zero.offload.nvme.enabled);
  EXPECT_FALSE(s2.zero.offload_param.enabled) << "parameter offload is stage 3's";
  json at0 = offloads;
  at0["stage"] = 0;
  EXPECT_FALSE(settings_of({{"zero_optimization", at0}}).zero.offload.enabled);
}

TEST(ZeroOptionsFrom, GradAccumDtypeOtherThanFp32OrTheTrainingTypeIsRefusedByName) {
  try {
    settings_of({{"bf16", {{"enabled", true}}}, {"data_types", {{"grad_accum_dtype", "fp16"}}}});
    ADD_FAILURE() << "fp16 accumulation of a bf16 model was accepted";
  } catch (const dscpp::ConfigError& e) {
    EXPECT_EQ(e.path(), "data_types.grad_accum_dtype") << e.what();
  }
}
