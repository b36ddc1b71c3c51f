// TFRecord framing, the container of TensorBoard event files. Each record is
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// all little-endian, as TensorFlow's RecordWriter writes and TensorBoard's readers check.
// CRC-32C (Castagnoli) comes from a 256-entry table: Debian 12 packages no crc32c library,
// and event files are a few kilobytes an hour.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dscpp::monitor {

// CRC-32C of `data`, continuing from `crc` (0 to start): crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view data, uint32_t crc = 0);

// TensorFlow's masked CRC: rotate right by 15 bits, add 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);

// One whole record holding `data`.
std::string tfrecord(std::string_view data);

}  // namespace dscpp::monitor
