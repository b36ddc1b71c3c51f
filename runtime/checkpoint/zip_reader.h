// ZipArchive: the records of a torch.save zip archive, read without LibTorch. torch.save (and
// our writer) stores every record uncompressed, so a record is a byte range of the file; the
// archive is checked whole when opened: the end record (ZIP64 too), every central-directory
// entry, every local header and every record's range inside the archive, so that nothing read
// later trusts an offset or a size the checks have not bounded. Reading a record checks its
// CRC-32 (LibTorch's reader does not). Errors are CheckpointError "zip archive: <what> (at
// byte N)"; the caller adds the file's name. Internal to runtime/checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace dscpp::checkpoint::detail {

class ZipArchive {
 public:
  // Copies n bytes at `offset` of the source into dst; the ranges asked for lie in [0, size).
  using ReadAt = std::function<void(uint64_t offset, size_t n, void* dst)>;
  ZipArchive(uint64_t size, ReadAt read_at);
  static ZipArchive open_file(const std::string& path);
  static ZipArchive from_memory(std::shared_ptr<const std::string> bytes);

  // Records are named without the archive's top folder ("data.pkl", "data/0").
  bool has(const std::string& name) const { return records_.count(name) != 0; }
  uint64_t size(const std::string& name) const;
  // Reads the whole record into dst (size(name) bytes) and checks its CRC-32.
  void read(const std::string& name, void* dst) const;
  std::string read_string(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  struct Record {
    uint64_t data_offset, size;
    uint32_t crc;
  };
  const Record& find(const std::string& name) const;
  void parse();

  uint64_t size_;
  ReadAt read_at_;
  std::unordered_map<std::string, Record> records_;
};

}  // namespace dscpp::checkpoint::detail
