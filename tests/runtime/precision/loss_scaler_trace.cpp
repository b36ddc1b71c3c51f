// loss_scaler_trace DS_CONFIG_JSON OVERFLOWS [OVERFLOWS...]
//
// For each OVERFLOWS, a string of '0' (good step) and '1' (overflow): builds a fresh LossScaler
// from the fp16 section of DS_CONFIG_JSON (read by parse_ds_config, as the engine does),
// applies the steps and prints one line
// {"scales": [scale after each step], "error": null | {"step": i, "message": ...},
//  "state": state_dict after the last applied step}. A sequence stops at its first error.
// Several sequences per run because loading LibTorch dominates the run time.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "dscpp/config/ds_config.h"
#include "dscpp/runtime/precision/loss_scaler.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s DS_CONFIG_JSON OVERFLOWS(0/1...)...\n", argv[0]);
    return 2;
  }
  try {
    const dscpp::DSConfig config = dscpp::parse_ds_config(nlohmann::json::parse(argv[1]));
    for (int arg = 2; arg < argc; ++arg) {
      dscpp::LossScaler scaler(config.fp16);
      const std::string overflows = argv[arg];
      nlohmann::json out = {{"scales", nlohmann::json::array()}, {"error", nullptr}};
      for (size_t i = 0; i < overflows.size(); ++i) {
        if (overflows[i] != '0' && overflows[i] != '1') {
          std::fprintf(stderr, "overflow sequences must be 0s and 1s\n");
          return 2;
        }
        try {
          scaler.update_scale(overflows[i] == '1');
        } catch (const dscpp::LossScaleAtMinimumError& e) {
          out["error"] = {{"step", i}, {"message", e.what()}};
          break;
        }
        out["scales"].push_back(scaler.loss_scale());
      }
      out["state"] = scaler.state_dict();
      std::cout << out.dump() << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loss_scaler_trace: %s\n", e.what());
    return 1;
  }
  return 0;
}
