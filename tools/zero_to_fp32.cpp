// zero_to_fp32 CHECKPOINT_DIR OUT [--tag TAG]: writes the checkpoint's consolidated fp32
// weights (keys and shapes of the module's state_dict) to OUT, a file torch.load opens, as
// DeepSpeed's zero_to_fp32.py does.
#include <boost/program_options.hpp>
#include <iostream>

#include "dscpp/comm/error_text.h"
#include "dscpp/runtime/checkpoint/fp32_state.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  std::string dir, out, tag;
  po::options_description opts("zero_to_fp32 CHECKPOINT_DIR OUT [--tag TAG]");
  opts.add_options()("help,h", "this text")("checkpoint_dir", po::value(&dir)->required(),
                                            "the folder save_checkpoint wrote (holds 'latest')")(
      "output_file", po::value(&out)->required(), "where to write the fp32 state dict")(
      "tag", po::value(&tag), "the checkpoint tag (default: the one 'latest' names)");
  po::positional_options_description pos;
  pos.add("checkpoint_dir", 1).add("output_file", 1);
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(opts).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << opts << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::cerr << "zero_to_fp32: " << e.what() << "\n" << opts << "\n";
    return 2;
  }
  try {
    auto sd = dscpp::checkpoint::get_fp32_state_dict_from_zero_checkpoint(dir, tag);
    dscpp::checkpoint::save_torch_file(sd, out);
    int64_t numel = 0;
    for (const auto& v : sd.values()) numel += v.as_tensor().numel();
    std::cout << "zero_to_fp32: wrote " << sd.size() << " tensors (" << numel << " elements) to "
              << out << "\n";
  } catch (const std::exception& e) {
    std::cerr << "zero_to_fp32: " << dscpp::comm::error_text(e) << "\n";
    return 1;
  }
  return 0;
}
