// Compiles against the installed <dscpp/dscpp.h>, resolves a config, prints one value.
#include <dscpp/dscpp.h>

#include <iostream>

int main() {
  dscpp::ConfigOptions options;
  options.world_size = 4;
  auto c = dscpp::load_ds_config(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})",
                                 options);
  std::cout << "micro_batch=" << c.train_micro_batch_size_per_gpu << "\n";
  return c.train_micro_batch_size_per_gpu == 4 ? 0 : 1;
}
