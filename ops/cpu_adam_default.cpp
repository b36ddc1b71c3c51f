// The CPU optimizers' kernels for the DEFAULT instruction set (ops/CMakeLists.txt gives this unit
// its flags and CPU_CAPABILITY=DEFAULT); see cpu_adam_kernels_impl.h.
#include "dscpp/ops/cpu_adam_kernels_impl.h"
