// runtime/checkpoint/pipe_layout.h by hand: DeepSpeed's names, the layer-file round trip and
// the refusals. test_pipe_layout.py checks the same against DeepSpeed's PipelineModule.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace ck = dscpp::checkpoint;
namespace fs = std::filesystem;

namespace {

std::string name(const std::string& path) {
  return fs::path(path).filename().string();
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("pipe_layout_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

TEST(PipeLayout, NamesAsDeepSpeedWritesThem) {
  EXPECT_EQ(ck::layer_file_name(5), "layer_05-model_states.pt");
  EXPECT_EQ(ck::layer_file_name(123), "layer_123-model_states.pt");
  EXPECT_EQ(ck::layer_file_name(5, 1), "layer_05-model_01-model_states.pt");
  // checkpoint_mp_rank under a pipeline: stage * model_size + model_rank.
  EXPECT_EQ(ck::pipe_mp_rank(0, 0, 1), 0);
  EXPECT_EQ(ck::pipe_mp_rank(3, 0, 1), 3);
  EXPECT_EQ(ck::pipe_mp_rank(1, 1, 2), 3);
  EXPECT_EQ(name(ck::pipe_model_states_path("d", "t", 1, 0, 1)), "mp_rank_01_model_states.pt");
  EXPECT_EQ(name(ck::pipe_zero_states_path("d", "t", 2, 1, 1, 2, false)),
            "zero_pp_rank_2_mp_rank_03_optim_states.pt");
  EXPECT_EQ(name(ck::pipe_zero_states_path("d", "t", 0, 0, 0, 1, true)),
            "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  EXPECT_THROW(ck::pipe_mp_rank(0, 2, 2), ck::CheckpointError);
  EXPECT_THROW(ck::layer_file_name(-1), ck::CheckpointError);
}

TEST(PipeLayout, LayerFilesRoundTripAndRefuseWhatIsNotOne) {
  TempDir dir;
  ck::make_tag_dir(dir.path.string(), "t");
  const auto w = at::arange(6, at::kFloat).reshape({2, 3});
  const auto b = at::full({2}, 0.5, at::kDouble);
  ck::save_layer_states({{"weight", w}, {"bias", b}},
                        ck::layer_states_path(dir.path.string(), "t", 7));
  const std::string found = ck::find_layer_states(dir.path.string(), "t", 7, 0, 1);
  EXPECT_EQ(name(found), "layer_07-model_states.pt");
  const auto back = ck::load_layer_states(found);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].first, "weight");
  EXPECT_TRUE(at::equal(back[0].second, w));
  EXPECT_EQ(back[1].first, "bias");
  EXPECT_TRUE(at::equal(back[1].second, b));
  // No file for a layer; files of another tensor-parallel size.
  EXPECT_THROW(ck::find_layer_states(dir.path.string(), "t", 8, 0, 1), ck::CheckpointError);
  EXPECT_THROW(ck::find_layer_states(dir.path.string(), "t", 7, 0, 2), ck::CheckpointError);
  // layer_70 is not layer_07's.
  ck::save_layer_states({}, ck::layer_states_path(dir.path.string(), "t", 70));
  EXPECT_EQ(name(ck::find_layer_states(dir.path.string(), "t", 7, 0, 1)),
            "layer_07-model_states.pt");
  // A file that is not a state dict.
  const std::string odd = (dir.path / "t" / "odd.pt").string();
  ck::save_torch_file(ck::PyValue::list({ck::PyValue(1)}), odd);
  EXPECT_THROW(ck::load_layer_states(odd), ck::CheckpointError);
  ck::PyValue not_tensors = ck::PyValue::dict();
  not_tensors.set("weight", 3);
  ck::save_torch_file(not_tensors, odd);
  EXPECT_THROW(ck::load_layer_states(odd), ck::CheckpointError);
  EXPECT_THROW(ck::save_layer_states({{"w", w}, {"w", w}}, odd), ck::CheckpointError);
}

}  // namespace
