// libFuzzer harness of ZipArchive (runtime/checkpoint/zip_reader.h): any bytes either open as
// an archive whose every record reads back (its CRC checked), or give a CheckpointError; any
// other exception, a crash or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/zip_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dscpp::checkpoint::detail::ZipArchive;
  auto bytes = std::make_shared<const std::string>(reinterpret_cast<const char*>(data), size);
  try {
    ZipArchive zip = ZipArchive::from_memory(bytes);
    for (const auto& name : zip.names()) {
      try {
        // A record lies inside the archive: reading it cannot allocate more than the input.
        if (zip.read_string(name).size() > size) __builtin_trap();
      } catch (const dscpp::checkpoint::CheckpointError&) {
      }
    }
  } catch (const dscpp::checkpoint::CheckpointError&) {
  }
  return 0;
}
