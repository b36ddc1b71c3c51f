// The error fp8 code throws for a tensor or setting it cannot take, apart from ops/fp8.h so
// that code without LibTorch (the model config's parser) can throw and catch it.
#pragma once

#include "dscpp/error.h"

namespace dscpp::ops::fp8 {

// A tensor or setting fp8 cannot take, named.
class Fp8Error : public dscpp::Error {
 public:
  using dscpp::Error::Error;
};

}  // namespace dscpp::ops::fp8
