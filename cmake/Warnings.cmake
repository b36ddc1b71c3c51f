# Warnings are errors in our own code (not in LibTorch's headers, included as SYSTEM).
add_library(dscpp_warnings INTERFACE)
target_compile_options(dscpp_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>)
