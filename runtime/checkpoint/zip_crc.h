// Record checksums of a torch.save zip archive. LibTorch's zip reader is built without CRC
// checks, so a flipped byte in a tensor would load silently: load_torch_file reads every
// record's CRC-32 from the zip central directory (ZIP64 included) and checks what it read
// against it. Both throw std::runtime_error saying what is wrong; no LibTorch needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace dscpp::checkpoint::detail {

// Record name (without the archive's top folder) -> CRC-32.
std::unordered_map<std::string, uint32_t> record_crcs(const std::string& path);
// Throws unless `n` bytes at `data` have the CRC-32 the directory gives record `name`.
void check_crc(const std::unordered_map<std::string, uint32_t>& crcs, const std::string& name,
               const void* data, size_t n);

}  // namespace dscpp::checkpoint::detail
