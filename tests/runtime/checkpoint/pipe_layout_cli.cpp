// pipe_layout_cli write DIR TAG [--model-axis]   our layer files of the known 4-layer model
// pipe_layout_cli read DIR TAG N                 layers 0..N-1 as JSON {layer: {key: {shape,
// values}}} pipe_layout_cli names L MODEL_RANK STAGE MODEL_SIZE DP_RANK   the file names, one a
// line The known model (tests/runtime/checkpoint/test_pipe_layout.py builds the same as DeepSpeed
// LayerSpecs): 0 Linear(4, 8), 1 ReLU (no parameters: an empty file, as DeepSpeed writes),
// 2 Linear(8, 8), 3 Linear(8, 2); element i of a tensor of layer L is
// ((i mod 17) - 8) / 8 + L / 16 (+ 1/32 for a bias), exact in float32.
#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/pipe_layout.h"

namespace ck = dscpp::checkpoint;

namespace {

at::Tensor known(std::vector<int64_t> shape, int layer, bool bias) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  auto i = at::arange(n, at::kLong);
  auto v =
      (at::remainder(i, 17) - 8).to(at::kDouble) / 8.0 + layer / 16.0 + (bias ? 1.0 / 32 : 0.0);
  return v.to(at::kFloat).reshape(shape);
}

int write(const std::string& dir, const std::string& tag, bool model_axis) {
  ck::make_tag_dir(dir, tag);
  const int rank = model_axis ? 0 : ck::kNoModelAxis;
  struct Lin {
    int layer, in, out;
  };
  for (const Lin& l : {Lin{0, 4, 8}, Lin{2, 8, 8}, Lin{3, 8, 2}})
    ck::save_layer_states(
        {{"weight", known({l.out, l.in}, l.layer, false)}, {"bias", known({l.out}, l.layer, true)}},
        ck::layer_states_path(dir, tag, l.layer, rank));
  ck::save_layer_states({}, ck::layer_states_path(dir, tag, 1, rank));
  return 0;
}

int read(const std::string& dir, const std::string& tag, int n) {
  nlohmann::ordered_json out;
  for (int layer = 0; layer < n; ++layer) {
    auto& entry = out[std::to_string(layer)];
    entry = nlohmann::ordered_json::object();
    for (const auto& [key, t] :
         ck::load_layer_states(ck::find_layer_states(dir, tag, layer, 0, 1))) {
      auto d = t.to(at::kDouble).contiguous();
      std::vector<double> values(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
      entry[key] = {{"shape", t.sizes().vec()},
                    {"dtype", std::string(c10::toString(t.scalar_type()))},
                    {"values", values}};
    }
  }
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc >= 4)
      return write(argv[2], argv[3], argc > 4 && std::string(argv[4]) == "--model-axis");
    if (mode == "read" && argc == 5) return read(argv[2], argv[3], std::stoi(argv[4]));
    if (mode == "names" && argc == 7) {
      const int layer = std::stoi(argv[2]), model_rank = std::stoi(argv[3]),
                stage = std::stoi(argv[4]), model_size = std::stoi(argv[5]),
                dp = std::stoi(argv[6]);
      namespace fs = std::filesystem;
      std::cout << ck::layer_file_name(layer, model_rank) << "\n"
                << fs::path(ck::pipe_model_states_path("d", "t", stage, std::max(model_rank, 0),
                                                       model_size))
                       .filename()
                       .string()
                << "\n"
                << fs::path(ck::pipe_zero_states_path("d", "t", dp, stage, std::max(model_rank, 0),
                                                      model_size, false))
                       .filename()
                       .string()
                << "\n";
      return 0;
    }
    std::cerr << "usage: pipe_layout_cli write DIR TAG [--model-axis] | read DIR TAG N | names L "
                 "MODEL_RANK STAGE "
                 "MODEL_SIZE DP_RANK\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
