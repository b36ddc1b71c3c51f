// torch_file_roundtrip write PATH   writes a DeepSpeed-model-states-shaped file
// torch_file_roundtrip read PATH    prints what a file holds as JSON
// Exit status 1 with the error on stderr when a file cannot be read or written.
#include <ATen/ATen.h>

#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "dscpp/runtime/checkpoint/torch_file.h"

namespace ck = dscpp::checkpoint;
using ck::PyValue;
using Json = nlohmann::ordered_json;

namespace {

// arange(n) * scale + shift, in dtype; exact in every dtype for the values used.
at::Tensor ramp(int64_t n, at::ScalarType dtype, double scale = 1.0, double shift = 0.0) {
  return (at::arange(n, at::kDouble) * scale + shift).to(dtype);
}

PyValue int_list(std::initializer_list<int64_t> v) {
  PyValue l = PyValue::list();
  for (int64_t x : v) l.append(x);
  return l;
}

PyValue model_states() {
  PyValue module = PyValue::ordered_dict();
  module.set("embed.weight", ramp(12, at::kFloat, 0.5, -3.0).reshape({4, 3}));
  module.set("layer.0.weight", ramp(6, at::kHalf, 0.25, 1.0).reshape({2, 3}));
  module.set("layer.0.bias", ramp(5, at::kBFloat16, 2.0, -4.0));
  // Non-contiguous: a transpose.
  module.set("layer.1.weight", ramp(6, at::kFloat, 1.0, 10.0).reshape({2, 3}).t());
  // Narrowed from a large storage: only its 4 elements may be saved.
  module.set("layer.1.bias", ramp(1000, at::kFloat).narrow(0, 500, 4));
  module.set("double", ramp(3, at::kDouble, 0.125));
  module.set("steps", ramp(4, at::kLong, 1000000000000.0));
  module.set("int32", ramp(4, at::kInt, -7.0));
  module.set("bytes", ramp(5, at::kByte, 50.0));
  module.set("mask", at::arange(6, at::kLong).remainder(2).to(at::kBool));
  module.set("scalar", at::scalar_tensor(2.5, at::kFloat));
  module.set("empty", at::empty({0, 3}, at::kFloat));

  PyValue shapes = PyValue::ordered_dict();
  shapes.set("embed.weight", int_list({4, 3}));
  shapes.set("layer.0.weight", int_list({2, 3}));
  PyValue param_shapes = PyValue::list({shapes});

  PyValue ds_config = PyValue::dict();
  ds_config.set("train_batch_size", 8);
  ds_config.set("fp16", PyValue::dict().set("enabled", true).set("loss_scale", 0.0));
  ds_config.set("zero_optimization", PyValue::dict().set("stage", 2).set("offload", PyValue()));
  ds_config.set("optimizer", PyValue::dict()
                                 .set("type", "AdamW")
                                 .set("params", PyValue::dict()
                                                    .set("lr", 0.001)
                                                    .set("betas", PyValue::list({0.9, 0.999}))
                                                    .set("weight_decay", 0.01)));

  PyValue lr_scheduler = PyValue::dict();
  lr_scheduler.set("last_batch_iteration", 41);
  lr_scheduler.set("warmup_min_lr", 0.0);
  lr_scheduler.set("warmup_max_lr", 0.001);
  lr_scheduler.set("_last_lr", PyValue::list({0.00042}));

  PyValue root = PyValue::dict();
  root.set("module", module);
  root.set("buffer_names", PyValue::list({"bn.running_mean", "bn.running_var"}));
  root.set("optimizer", PyValue());
  root.set("param_shapes", param_shapes);
  root.set("frozen_param_shapes", PyValue());
  root.set("shared_params", PyValue::dict());
  root.set("lr_scheduler", lr_scheduler);
  root.set("data_sampler", PyValue());
  root.set("random_ltd", PyValue());
  root.set("sparse_tensor_module_names", PyValue::list());
  root.set("skipped_steps", 0);
  root.set("global_steps", 42);
  root.set("global_samples", 336);
  root.set("dp_world_size", 1);
  root.set("mp_world_size", 1);
  root.set("ds_config", ds_config);
  root.set("ds_version", "0.19.8");
  root.set("loss_scale", 65536.0);
  root.set("overflow", false);
  root.set("big_int", int64_t{-5000000000});
  root.set("neg_small", -3);
  root.set("medium", 70000);
  root.set("unicode", "grüße ✓");
  root.set("tuple", PyValue::tuple({1, "two", 3.0, PyValue()}));
  root.set("small_tuple", PyValue::tuple({7, 8}));
  root.set("int_keys", PyValue::dict().set(0, "zero").set(1, "one"));
  PyValue shared = ramp(3, at::kFloat, 1.0, 100.0);
  root.set("shared_a", shared);
  root.set("shared_b", shared);
  return root;
}

Json to_json(const PyValue& v) {
  switch (v.kind()) {
    case PyValue::Kind::None:
      return nullptr;
    case PyValue::Kind::Bool:
      return v.as_bool();
    case PyValue::Kind::Int:
      return v.as_int();
    case PyValue::Kind::Double:
      return v.as_double();
    case PyValue::Kind::String:
      return v.as_string();
    case PyValue::Kind::List: {
      Json a = Json::array();
      for (const auto& x : v.items()) a.push_back(to_json(x));
      return a;
    }
    case PyValue::Kind::Tuple: {
      Json a = Json::array();
      for (const auto& x : v.items()) a.push_back(to_json(x));
      return Json{{"tuple", a}};
    }
    case PyValue::Kind::Dict: {
      Json items = Json::array();
      for (size_t i = 0; i < v.size(); ++i) {
        items.push_back(Json::array({to_json(v.keys()[i]), to_json(v.values()[i])}));
      }
      return Json{{v.ordered() ? "ordered_dict" : "dict", items}};
    }
    case PyValue::Kind::Tensor: {
      const at::Tensor& t = v.as_tensor();
      Json shape = Json::array();
      for (int64_t s : t.sizes()) shape.push_back(s);
      at::Tensor d = t.detach().to(at::kDouble).contiguous();
      Json values = Json::array();
      const double* p = d.const_data_ptr<double>();
      for (int64_t i = 0; i < d.numel(); ++i) values.push_back(p[i]);
      std::string dtype = c10::toString(t.scalar_type());
      return Json{{"tensor",
                   {{"dtype", dtype},
                    {"shape", shape},
                    {"sum", d.numel() ? d.sum().item<double>() : 0.0},
                    {"values", values}}}};
    }
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "read") != 0)) {
    std::cerr << "usage: torch_file_roundtrip write|read PATH\n";
    return 2;
  }
  try {
    if (std::strcmp(argv[1], "write") == 0) {
      ck::save_torch_file(model_states(), argv[2]);
    } else {
      std::cout << to_json(ck::load_torch_file(argv[2]))
                       .dump(-1, ' ', false, Json::error_handler_t::replace)
                << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
