// LibTorch's custom autograd Function (torch/csrc/autograd/custom_function.h), for the
// translation units that define one. Include it first, before any other header: g++ 13 at -O3
// reports a false out-of-bounds memmove in the std::vector<bool> that Function::apply fills,
// once apply is inlined; the diagnostic is located in the standard headers' code, so it must
// be silenced before those are read (the pragmas then hold for the rest of the unit).
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
#include <torch/csrc/autograd/custom_function.h>
