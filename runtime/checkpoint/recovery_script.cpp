// Writing the consolidation script into a checkpoint folder: see recovery_script.h.
#include "dscpp/runtime/checkpoint/recovery_script.h"

#include <filesystem>

#include "dscpp/runtime/checkpoint/atomic_file.h"

namespace dscpp::checkpoint {

void write_zero_to_fp32_script(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "zero_to_fp32.py").string();
  AtomicFile out(path);
  const std::string_view text = zero_to_fp32_script();
  out.write(text.data(), text.size());
  out.set_mode(0755);
  out.commit();
}

}  // namespace dscpp::checkpoint
