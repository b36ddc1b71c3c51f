// The CPU optimizers' kernels for the AVX512 instruction set (ops/CMakeLists.txt gives this unit
// its flags and CPU_CAPABILITY=AVX512); see cpu_adam_kernels_impl.h.
#include "dscpp/ops/cpu_adam_kernels_impl.h"
