// Writing the consolidation script into a checkpoint folder: see recovery_script.h.
#include "dscpp/runtime/checkpoint/recovery_script.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"

namespace dscpp::checkpoint {

void write_zero_to_fp32_script(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "zero_to_fp32.py").string();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const std::string_view text = zero_to_fp32_script();
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!out) throw CheckpointError("cannot write '" + tmp + "'");
  }
  ::chmod(tmp.c_str(), 0755);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw CheckpointError("cannot rename '" + tmp + "' to '" + path + "'");
}

}  // namespace dscpp::checkpoint
