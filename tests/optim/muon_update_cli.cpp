// muon_update_cli IN OUT: reads a torch.save'd list of cases, each a dict {grad, momentum,
// method, nesterov, expert_group, num_heads (0: none), beta}, runs optim::muon_update on each,
// and writes the list of {update, momentum, grad} (grad as muon_update leaves it) to OUT.
#include <ATen/ATen.h>

#include <iostream>

#include "dscpp/optim/muon_update.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace ck = dscpp::checkpoint;
namespace optim = dscpp::optim;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: muon_update_cli IN OUT\n";
    return 2;
  }
  try {
    const ck::PyValue cases = ck::load_torch_file(argv[1]);
    ck::PyValue out = ck::PyValue::list();
    for (size_t i = 0; i < cases.size(); ++i) {
      const ck::PyValue& c = cases.items()[i];
      auto field = [&](const char* k) { return c.find(ck::PyValue(k)); };
      at::Tensor grad = field("grad")->as_tensor().clone();
      at::Tensor momentum = field("momentum")->as_tensor().clone();
      optim::MuonUpdateOptions o;
      o.method = optim::ns_method_from(field("method")->as_string());
      o.nesterov = field("nesterov")->as_bool();
      o.expert_group = field("expert_group")->as_bool();
      o.beta = field("beta")->as_double();
      if (const int64_t heads = field("num_heads")->as_int(); heads > 0) o.num_heads = heads;
      const at::Tensor update = optim::muon_update(grad, momentum, o);
      out.append(
          ck::PyValue::dict().set("update", update).set("momentum", momentum).set("grad", grad));
    }
    ck::save_torch_file(out, argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "muon_update_cli: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
