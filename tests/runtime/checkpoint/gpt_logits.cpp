// gpt_logits --model-config GPT.json --weights W.pt --ids IDS.pt --out LOGITS.pt [--dtype bf16]
// Our GPT (model_zoo/gpt.h) with the weights of W.pt (every parameter, by state_dict name),
// in eval mode, on the int64 token ids [B, S] in IDS.pt: writes its logits [B, S, V] (fp32)
// to LOGITS.pt. With --dtype bf16 the model is cast to bf16 first. For hf_gpt2_oracle.py.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <boost/program_options.hpp>
#include <iostream>

#include "dscpp/model_zoo/gpt.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace po = boost::program_options;
using dscpp::checkpoint::PyValue;

int main(int argc, char** argv) {
  std::string config, weights, ids, out, dtype = "fp32";
  po::options_description opts("gpt_logits");
  opts.add_options()("model-config", po::value(&config)->required(), "the GPT's JSON config")(
      "weights", po::value(&weights)->required(), "a .pt state dict")(
      "ids", po::value(&ids)->required(), "a .pt file holding one int64 tensor [B, S]")(
      "out", po::value(&out)->required(), "where to write the logits")(
      "dtype", po::value(&dtype)->default_value(dtype), "fp32 or bf16");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
    torch::NoGradGuard no_grad;
    dscpp::model_zoo::GPT gpt(dscpp::model_zoo::GPTConfig::from_file(config));
    const PyValue sd = dscpp::checkpoint::load_torch_file(weights);
    size_t loaded = 0;
    for (auto& item : gpt->named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& p = item.value();
      const PyValue* v = sd.find(PyValue(name));
      if (!v) throw std::runtime_error("'" + weights + "' has no '" + name + "'");
      p.copy_(v->as_tensor());
      ++loaded;
    }
    if (dtype == "bf16") gpt->to(at::kBFloat16);
    gpt->eval();
    const PyValue input = dscpp::checkpoint::load_torch_file(ids);
    at::Tensor logits = gpt->forward(input.as_tensor()).to(at::kFloat);
    dscpp::checkpoint::save_torch_file(PyValue(logits), out);
    std::cout << "gpt_logits: " << loaded << " parameters, logits " << logits.sizes() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gpt_logits: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
