// Record checksums of a zip archive: see zip_crc.h.
#include "dscpp/runtime/checkpoint/zip_crc.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "dscpp/error.h"

namespace dscpp::checkpoint::detail {

namespace {

uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::unordered_map<std::string, uint32_t> record_crcs(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw dscpp::Error(std::string("cannot open: ") + std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, std::fclose);
  auto read_at = [&](uint64_t off, size_t n) {
    std::string buf(n, '\0');
    if (fseeko(f, static_cast<off_t>(off), SEEK_SET) != 0 || std::fread(buf.data(), 1, n, f) != n)
      throw dscpp::Error("truncated zip archive");
    return buf;
  };
  if (fseeko(f, 0, SEEK_END) != 0) throw dscpp::Error("cannot seek");
  const uint64_t size = static_cast<uint64_t>(ftello(f));
  // The end-of-central-directory record: 22 bytes plus a comment of up to 64 KiB.
  const uint64_t tail_len = std::min<uint64_t>(size, 22 + 65535);
  std::string tail = read_at(size - tail_len, tail_len);
  int64_t eocd = -1;
  for (int64_t i = static_cast<int64_t>(tail_len) - 22; i >= 0; --i) {
    if (le(reinterpret_cast<const unsigned char*>(tail.data()) + i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw dscpp::Error("no zip end-of-central-directory record (truncated?)");
  const auto* e = reinterpret_cast<const unsigned char*>(tail.data()) + eocd;
  uint64_t entries = le(e + 10, 2), cd_size = le(e + 12, 4), cd_off = le(e + 16, 4);
  if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {
    // ZIP64: the locator just before the record points at the ZIP64 end record.
    if (eocd < 20) throw dscpp::Error("ZIP64 locator missing");
    const auto* loc = e - 20;
    if (le(loc, 4) != 0x07064b50) throw dscpp::Error("ZIP64 locator missing");
    std::string z = read_at(le(loc + 8, 8), 56);
    const auto* zp = reinterpret_cast<const unsigned char*>(z.data());
    if (le(zp, 4) != 0x06064b50) throw dscpp::Error("bad ZIP64 end record");
    entries = le(zp + 32, 8);
    cd_size = le(zp + 40, 8);
    cd_off = le(zp + 48, 8);
  }
  if (cd_off + cd_size > size) throw dscpp::Error("zip central directory past the end");
  std::string cd = read_at(cd_off, cd_size);
  std::unordered_map<std::string, uint32_t> crcs;
  size_t pos = 0;
  for (uint64_t k = 0; k < entries; ++k) {
    if (pos + 46 > cd.size()) throw dscpp::Error("zip central directory truncated");
    const auto* h = reinterpret_cast<const unsigned char*>(cd.data()) + pos;
    if (le(h, 4) != 0x02014b50) throw dscpp::Error("bad zip central directory entry");
    const size_t name_len = le(h + 28, 2), extra_len = le(h + 30, 2), comment_len = le(h + 32, 2);
    if (pos + 46 + name_len > cd.size()) throw dscpp::Error("zip central directory truncated");
    std::string name = cd.substr(pos + 46, name_len);
    auto slash = name.find('/');
    crcs[slash == std::string::npos ? name : name.substr(slash + 1)] =
        static_cast<uint32_t>(le(h + 16, 4));
    pos += 46 + name_len + extra_len + comment_len;
  }
  return crcs;
}

void check_crc(const std::unordered_map<std::string, uint32_t>& crcs, const std::string& name,
               const void* data, size_t n) {
  auto it = crcs.find(name);
  if (it == crcs.end()) throw dscpp::Error("record " + name + " is not in the zip directory");
  uLong c = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  // zlib's crc32 takes a uInt length: feed it in pieces below 4 GiB.
  for (size_t done = 0; done < n;) {
    const size_t piece = std::min<size_t>(n - done, 1u << 30);
    c = crc32(c, p + done, static_cast<uInt>(piece));
    done += piece;
  }
  if (static_cast<uint32_t>(c) != it->second)
    throw dscpp::Error("record " + name + " is corrupt (its CRC-32 does not match)");
}

}  // namespace dscpp::checkpoint::detail
