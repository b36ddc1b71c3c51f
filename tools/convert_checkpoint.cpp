// convert_checkpoint: the GPT's consolidated weights (model_zoo/gpt.h's state_dict names) to
// Hugging Face's GPT-2 layout (model.safetensors + config.json, what
// GPT2LMHeadModel.from_pretrained reads) and back.
//
//   convert_checkpoint --to hf --input W --model-config gpt.json --output HF_DIR [--dtype bf16]
//   convert_checkpoint --to dscpp --input HF_DIR --output W.pt [--model-config-out gpt.json]
//
// W is zero_to_fp32's output (a .pt state dict) or a checkpoint folder (its `latest` tag,
// consolidated here). The mapping: embedding.word -> transformer.wte, embedding.position ->
// transformer.wpe, blocks.<i>.{ln_1,ln_2} -> transformer.h.<i>.{ln_1,ln_2}, attn.qkv ->
// attn.c_attn, attn.proj -> attn.c_proj, mlp.fc -> mlp.c_fc, mlp.proj -> mlp.c_proj,
// final_norm -> transformer.ln_f, head -> lm_head (untied only: a tied head is wte, which
// transformers ties itself). GPT-2's Conv1D stores its weight [in, out], the transpose of our
// Linear's [out, in]; q, k, v lie in the same order in both. transformers 5 keeps no attn.bias
// mask buffers; the ones older files hold are skipped on the way back.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <stdexcept>
#include <tuple>

#include "dscpp/comm/error_text.h"
#include "dscpp/model_zoo/gpt_config.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/fp32_state.h"
#include "dscpp/runtime/checkpoint/safetensors.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using dscpp::checkpoint::CheckpointError;
using dscpp::checkpoint::NamedTensors;
using dscpp::checkpoint::PyValue;
using dscpp::model_zoo::GPTConfig;
using nlohmann::json;

namespace {

// One block's names: ours, GPT-2's (under transformer.h.<i>.), and whether GPT-2 transposes.
struct BlockName {
  const char* ours;
  const char* hf;
  bool transposed;
};
constexpr BlockName kBlock[] = {{"ln_1.weight", "ln_1.weight", false},
                                {"ln_1.bias", "ln_1.bias", false},
                                {"attn.qkv.weight", "attn.c_attn.weight", true},
                                {"attn.qkv.bias", "attn.c_attn.bias", false},
                                {"attn.proj.weight", "attn.c_proj.weight", true},
                                {"attn.proj.bias", "attn.c_proj.bias", false},
                                {"ln_2.weight", "ln_2.weight", false},
                                {"ln_2.bias", "ln_2.bias", false},
                                {"mlp.fc.weight", "mlp.c_fc.weight", true},
                                {"mlp.fc.bias", "mlp.c_fc.bias", false},
                                {"mlp.proj.weight", "mlp.c_proj.weight", true},
                                {"mlp.proj.bias", "mlp.c_proj.bias", false}};

// (ours, GPT-2's, transposed) for every tensor of a GPT of `c`.
std::vector<std::tuple<std::string, std::string, bool>> name_map(const GPTConfig& c) {
  std::vector<std::tuple<std::string, std::string, bool>> m = {
      {"embedding.word.weight", "transformer.wte.weight", false},
      {"embedding.position.weight", "transformer.wpe.weight", false}};
  for (int64_t i = 0; i < c.num_layers; ++i)
    for (const BlockName& b : kBlock)
      m.emplace_back(fmt::format("blocks.{}.{}", i, b.ours),
                     fmt::format("transformer.h.{}.{}", i, b.hf), b.transposed);
  m.emplace_back("final_norm.weight", "transformer.ln_f.weight", false);
  m.emplace_back("final_norm.bias", "transformer.ln_f.bias", false);
  if (!c.tie_word_embeddings) m.emplace_back("head.weight", "lm_head.weight", false);
  return m;
}

json hf_config(const GPTConfig& c, const std::string& dtype) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab_size},
          {"n_positions", c.positions()},
          {"n_embd", c.hidden_size},
          {"n_layer", c.num_layers},
          {"n_head", c.num_attention_heads},
          {"n_inner", c.ffn_size()},
          // gelu_new is GPT-2's tanh approximation; "gelu" the exact erf.
          {"activation_function", c.gelu_approximation == "tanh" ? "gelu_new" : "gelu"},
          {"resid_pdrop", c.hidden_dropout},
          {"embd_pdrop", c.hidden_dropout},
          {"attn_pdrop", c.attention_dropout},
          {"layer_norm_epsilon", c.layernorm_epsilon},
          {"initializer_range", c.init_method_std},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          // GPT-2's <|endoftext|>, where the vocabulary has it (transformers warns otherwise).
          {"bos_token_id", c.vocab_size > 50256 ? json(50256) : json(nullptr)},
          {"eos_token_id", c.vocab_size > 50256 ? json(50256) : json(nullptr)},
          {"dtype", dtype}};
}

GPTConfig gpt_config(const json& hf, const std::string& path) {
  auto get = [&](const char* key) {
    if (!hf.contains(key) || hf[key].is_null())
      throw CheckpointError("'" + path + "' has no '" + key + "'");
    return hf[key];
  };
  if (hf.value("model_type", std::string()) != "gpt2")
    throw CheckpointError("'" + path + "': model_type is '" + hf.value("model_type", "") +
                          "', expected 'gpt2' (only GPT-2's layout converts; Llama's and "
                          "Mixtral's are not read)");
  for (const char* key : {"scale_attn_by_inverse_layer_idx"})
    if (hf.value(key, false)) throw CheckpointError("'" + path + "': " + key + " is not supported");
  if (!hf.value("scale_attn_weights", true))
    throw CheckpointError("'" + path + "': scale_attn_weights=false is not supported");
  const std::string act = hf.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu" && act != "gelu_pytorch_tanh")
    throw CheckpointError("'" + path + "': activation_function '" + act +
                          "' (the GPT has gelu_new, gelu_pytorch_tanh or gelu)");
  json j = {{"hidden_size", get("n_embd")},
            {"num_layers", get("n_layer")},
            {"num_attention_heads", get("n_head")},
            {"seq_length", get("n_positions")},
            {"max_position_embeddings", get("n_positions")},
            {"vocab_size", get("vocab_size")},
            {"hidden_dropout", hf.value("resid_pdrop", 0.1)},
            {"attention_dropout", hf.value("attn_pdrop", 0.1)},
            {"layernorm_epsilon", hf.value("layer_norm_epsilon", 1e-5)},
            {"init_method_std", hf.value("initializer_range", 0.02)},
            {"tie_word_embeddings", hf.value("tie_word_embeddings", true)},
            {"gelu_approximation", act == "gelu" ? "none" : "tanh"}};
  if (hf.contains("n_inner") && !hf["n_inner"].is_null()) j["ffn_hidden_size"] = hf["n_inner"];
  if (hf.value("embd_pdrop", j["hidden_dropout"].get<double>()) !=
      j["hidden_dropout"].get<double>())
    std::cerr << "convert_checkpoint: embd_pdrop differs from resid_pdrop; the GPT uses "
                 "resid_pdrop for both\n";
  return GPTConfig::from_json(j);
}

at::ScalarType dtype_of(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  throw CheckpointError("--dtype '" + s + "': expected fp32, bf16 or fp16");
}

const char* hf_dtype_name(at::ScalarType t) {
  return t == at::kFloat ? "float32" : t == at::kBFloat16 ? "bfloat16" : "float16";
}

void to_hf(const std::string& input, const std::string& model_config, const std::string& output,
           const std::string& dtype_name) {
  const GPTConfig c = GPTConfig::from_file(model_config);
  // Hugging Face's GPT-2 layout has GPT-2's blocks only (a Llama-style model is another format).
  if (const std::string key = c.first_non_gpt2_block_key(); !key.empty())
    throw std::invalid_argument(fmt::format(
        "{}: {} = {} has no place in Hugging Face's GPT-2 format (the one --to hf writes); "
        "only GPT-2's blocks convert",
        model_config, key, c.to_json()[key].dump()));
  const PyValue sd = fs::is_directory(input)
                         ? dscpp::checkpoint::get_fp32_state_dict_from_zero_checkpoint(input)
                         : dscpp::checkpoint::load_torch_file(input);
  if (!sd.is_dict()) throw CheckpointError("'" + input + "' does not hold a state dict");
  const at::ScalarType dtype = dtype_of(dtype_name);
  NamedTensors out;
  for (const auto& [ours, hf, transposed] : name_map(c)) {
    const PyValue* v = sd.find(PyValue(ours));
    if (!v || !v->is_tensor())
      throw CheckpointError("'" + input + "' has no tensor '" + ours + "' (a GPT of " +
                            model_config + " needs it)");
    at::Tensor t = v->as_tensor();
    if (transposed) t = t.t();
    out.emplace_back(hf, t.to(dtype).contiguous());
  }
  fs::create_directories(output);
  dscpp::checkpoint::save_safetensors(out, (fs::path(output) / "model.safetensors").string(),
                                      {{"format", "pt"}});
  std::ofstream(fs::path(output) / "config.json")
      << hf_config(c, hf_dtype_name(dtype)).dump(2) << "\n";
  std::cout << "convert_checkpoint: wrote " << out.size() << " tensors to "
            << (fs::path(output) / "model.safetensors").string() << " and config.json\n";
}

void to_dscpp(const std::string& input, const std::string& output, const std::string& config_out) {
  const std::string cfg_path = (fs::path(input) / "config.json").string();
  std::ifstream cfg_in(cfg_path);
  if (!cfg_in) throw CheckpointError("cannot open '" + cfg_path + "'");
  json hf;
  try {
    hf = json::parse(cfg_in);
  } catch (const std::exception& e) {
    throw CheckpointError("'" + cfg_path + "': " + e.what());
  }
  const GPTConfig c = gpt_config(hf, cfg_path);
  const std::string st_path = (fs::path(input) / "model.safetensors").string();
  if (!fs::exists(st_path))
    throw CheckpointError("'" + input +
                          "' has no model.safetensors (sharded and .bin files are "
                          "not read)");
  const auto st = dscpp::checkpoint::load_safetensors(st_path);
  std::map<std::string, at::Tensor> by_name;
  // Hub files of GPT-2 itself name the tensors without "transformer.".
  for (const auto& [name, t] : st.tensors) {
    const bool bare = name.rfind("transformer.", 0) != 0 && name.rfind("lm_head.", 0) != 0;
    by_name[bare ? "transformer." + name : name] = t;
  }
  PyValue sd = PyValue::ordered_dict();
  std::set<std::string> used;
  for (const auto& [ours, hfname, transposed] : name_map(c)) {
    auto it = by_name.find(hfname);
    if (it == by_name.end())
      throw CheckpointError("'" + st_path + "' has no tensor '" + hfname + "'");
    at::Tensor t = it->second.to(at::kFloat);
    sd.set(PyValue(ours), PyValue((transposed ? t.t() : t).contiguous()));
    used.insert(hfname);
  }
  static const std::regex skipped(R"(transformer\.h\.\d+\.attn\.(bias|masked_bias))");
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : by_name) {
    if (used.count(name) || std::regex_match(name, skipped)) continue;
    if (name == "lm_head.weight" && c.tie_word_embeddings) continue;  // the tied wte again
    unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    std::string list;
    for (const auto& n : unexpected) list += (list.empty() ? "" : ", ") + n;
    throw CheckpointError("'" + st_path + "' holds tensors a GPT-2 does not: " + list);
  }
  dscpp::checkpoint::save_torch_file(sd, output);
  if (!config_out.empty()) std::ofstream(config_out) << c.to_json().dump(2) << "\n";
  std::cout << "convert_checkpoint: wrote " << sd.size() << " tensors to " << output
            << (config_out.empty() ? "" : " and the GPT config to " + config_out) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::string to, input, output, model_config, config_out, dtype = "fp32", format = "gpt2";
  po::options_description opts(
      "convert_checkpoint --to hf --input WEIGHTS --model-config GPT.json --output HF_DIR\n"
      "convert_checkpoint --to dscpp --input HF_DIR --output WEIGHTS.pt [--model-config-out "
      "GPT.json]\n"
      "The GPT's weights (zero_to_fp32's output, or a checkpoint folder) to and from Hugging\n"
      "Face's GPT-2 layout (model.safetensors + config.json, GPT2LMHeadModel). Llama's and\n"
      "Mixtral's layouts are not converted");
  opts.add_options()("help,h", "this text")("to", po::value(&to)->required(), "hf or dscpp")(
      "input", po::value(&input)->required(),
      "--to hf: a .pt state dict or a checkpoint folder; --to dscpp: a Hugging Face folder")(
      "output", po::value(&output)->required(),
      "--to hf: the folder to write; --to dscpp: the .pt file to write")(
      "model-config", po::value(&model_config), "--to hf: the GPT's JSON config (train_gpt's)")(
      "model-config-out", po::value(&config_out), "--to dscpp: where to write the GPT's config")(
      "dtype", po::value(&dtype)->default_value(dtype), "--to hf: fp32, bf16 or fp16")(
      "format", po::value(&format)->default_value(format), "gpt2 (the only one today)");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("help")) {
      std::cout << opts << "\n";
      return 0;
    }
    po::notify(vm);
    if (format != "gpt2")
      throw po::error("--format '" + format +
                      "': only gpt2 (Llama's layout waits for the RMSNorm/RoPE/SwiGLU blocks)");
    if (to == "hf" && model_config.empty()) throw po::error("--to hf needs --model-config");
    if (to != "hf" && to != "dscpp") throw po::error("--to '" + to + "': expected hf or dscpp");
  } catch (const std::exception& e) {
    std::cerr << "convert_checkpoint: " << e.what() << "\n" << opts << "\n";
    return 2;
  }
  try {
    if (to == "hf")
      to_hf(input, model_config, output, dtype);
    else
      to_dscpp(input, output, config_out);
  } catch (const std::exception& e) {
    std::cerr << "convert_checkpoint: " << dscpp::comm::error_text(e) << "\n";
    return 1;
  }
  return 0;
}
