// to_universal --input_folder CKPT/TAG [--output_folder CKPT/TAG_universal]: DeepSpeed's
// ds_to_universal for dscpp's checkpoints (ZeRO stages 0-3, any number of data ranks). Writes
// the universal layout (runtime/checkpoint/universal.h) and CKPT/latest_universal, so that
// DeepSpeed's engine, or ours, loads it with `"checkpoint": {"load_universal": true}`.
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>

#include "dscpp/comm/error_text.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::string in, out;
  po::options_description opts(
      "to_universal --input_folder CKPT/TAG [--output_folder CKPT/TAG_universal]\n"
      "Writes a dscpp checkpoint (ZeRO stages 0-3, any number of ranks) in DeepSpeed's universal\n"
      "layout and CKPT/latest_universal, as DeepSpeed's ds_to_universal does for its own");
  opts.add_options()("help,h", "this text")(
      "input_folder", po::value(&in)->required(),
      "the tag folder save_checkpoint wrote (CKPT/global_step10), or CKPT itself (then the tag "
      "its 'latest' names)")("output_folder", po::value(&out),
                             "where to write (default: the tag folder's name + '_universal', "
                             "beside it); its parent gets 'latest_universal'");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("help")) {
      std::cout << opts << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "to_universal: " << e.what() << "\n" << opts << "\n";
    return 2;
  }
  try {
    fs::path input = fs::path(in).lexically_normal();
    if (input.filename().empty()) input = input.parent_path();
    std::string dir = input.parent_path().string(), tag = input.filename().string();
    if (fs::exists(input / "latest")) {  // CKPT itself
      dir = input.string();
      tag = dscpp::checkpoint::read_latest(dir).value_or("");
    }
    if (dir.empty()) dir = ".";
    auto ck = dscpp::checkpoint::universal_from_zero_checkpoint(dir, tag);
    fs::path output =
        out.empty() ? fs::path(dir) / (tag + "_universal") : fs::path(out).lexically_normal();
    if (output.filename().empty()) output = output.parent_path();
    std::string out_dir = output.parent_path().string();
    if (out_dir.empty()) out_dir = ".";
    dscpp::checkpoint::write_universal(ck, out_dir, output.filename().string());
    std::cout << "to_universal: wrote " << ck.params.size() << " parameters of "
              << dscpp::checkpoint::tag_dir(dir, tag) << " to " << output.string() << " and "
              << (fs::path(out_dir) / "latest_universal").string() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "to_universal: " << dscpp::comm::error_text(e) << "\n";
    return 1;
  }
  return 0;
}
