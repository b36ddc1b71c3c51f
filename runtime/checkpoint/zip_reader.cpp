// ZipArchive: see zip_reader.h. The zip format: PKWARE's APPNOTE.TXT (sections 4.3-4.5).
#include "dscpp/runtime/checkpoint/zip_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"

namespace dscpp::checkpoint::detail {

namespace {

constexpr uint32_t kEndSig = 0x06054b50, kZip64EndSig = 0x06064b50, kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kCentralSig = 0x02014b50, kLocalSig = 0x04034b50;
constexpr size_t kEndLen = 22, kCentralLen = 46, kLocalLen = 30, kZip64EndLen = 56;

uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

[[noreturn]] void fail(const std::string& what, uint64_t at) {
  throw CheckpointError("zip archive: " + what + " (at byte " + std::to_string(at) + ")");
}

// A file descriptor shared by the copies of an archive's ReadAt.
struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

}  // namespace

ZipArchive::ZipArchive(uint64_t size, ReadAt read_at) : size_(size), read_at_(std::move(read_at)) {
  parse();
}

ZipArchive ZipArchive::open_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(std::string("cannot open: ") + std::strerror(errno));
  std::shared_ptr<Fd> handle(new Fd{fd});  // a temporary Fd would close fd
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw CheckpointError("not a regular file");
  return ZipArchive(static_cast<uint64_t>(st.st_size), [handle](uint64_t off, size_t n, void* dst) {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t got = ::pread(handle->fd, p, n, static_cast<off_t>(off));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail(got < 0 ? std::strerror(errno) : "file shrank", off);
      p += got;
      off += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
  });
}

ZipArchive ZipArchive::from_memory(std::shared_ptr<const std::string> bytes) {
  const uint64_t size = bytes->size();
  return ZipArchive(size, [bytes](uint64_t off, size_t n, void* dst) {
    std::memcpy(dst, bytes->data() + off, n);
  });
}

void ZipArchive::parse() {
  auto get = [&](uint64_t off, uint64_t n, const char* what) {
    if (off > size_ || n > size_ - off) fail(std::string(what) + " lies past the end", off);
    std::string buf(n, '\0');
    if (n) read_at_(off, n, buf.data());
    return buf;
  };
  if (size_ < kEndLen)
    fail("too short for a zip archive (" + std::to_string(size_) + " bytes; truncated?)", 0);
  // The end record: 22 bytes and a comment of up to 64 KiB, so in the last 22 + 65535 bytes.
  const uint64_t tail_len = std::min<uint64_t>(size_, kEndLen + 65535);
  const uint64_t tail_at = size_ - tail_len;
  const std::string tail = get(tail_at, tail_len, "end record");
  const auto* t = reinterpret_cast<const unsigned char*>(tail.data());
  int64_t end = -1;
  for (int64_t i = static_cast<int64_t>(tail_len - kEndLen); i >= 0; --i) {
    if (le(t + i, 4) == kEndSig) {
      end = i;
      break;
    }
  }
  if (end < 0) fail("no end-of-central-directory record (truncated, or not a zip file)", size_);
  const unsigned char* e = t + end;
  const uint64_t end_at = tail_at + static_cast<uint64_t>(end);
  if (le(e + 4, 2) != 0 || le(e + 6, 2) != 0)
    fail("split (multi-disk) archives are not read", end_at);
  uint64_t entries = le(e + 10, 2), cd_size = le(e + 12, 4), cd_off = le(e + 16, 4);
  uint64_t cd_limit = end_at;  // the central directory ends where the end records begin
  if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {
    // ZIP64: a 20-byte locator just before the end record points at the ZIP64 end record.
    if (end_at < 20) fail("ZIP64 locator missing", end_at);
    const std::string loc = get(end_at - 20, 20, "ZIP64 locator");
    const auto* l = reinterpret_cast<const unsigned char*>(loc.data());
    if (le(l, 4) != kZip64LocatorSig) fail("ZIP64 locator missing", end_at - 20);
    const uint64_t z_at = le(l + 8, 8);
    if (z_at > end_at - 20 || end_at - 20 - z_at < kZip64EndLen)
      fail("ZIP64 end record lies outside the archive", end_at - 20);
    const std::string z = get(z_at, kZip64EndLen, "ZIP64 end record");
    const auto* zp = reinterpret_cast<const unsigned char*>(z.data());
    if (le(zp, 4) != kZip64EndSig) fail("bad ZIP64 end record signature", z_at);
    entries = le(zp + 32, 8);
    cd_size = le(zp + 40, 8);
    cd_off = le(zp + 48, 8);
    cd_limit = z_at;
  }
  if (cd_off > cd_limit || cd_size > cd_limit - cd_off)
    fail("central directory (" + std::to_string(cd_size) + " bytes at " + std::to_string(cd_off) +
             ") lies outside the archive",
         end_at);
  if (entries > cd_size / kCentralLen)
    fail(std::to_string(entries) + " entries cannot fit a central directory of " +
             std::to_string(cd_size) + " bytes",
         end_at);
  const std::string cd = get(cd_off, cd_size, "central directory");
  const auto* c = reinterpret_cast<const unsigned char*>(cd.data());
  size_t pos = 0;
  for (uint64_t k = 0; k < entries; ++k) {
    const uint64_t at = cd_off + pos;
    if (cd.size() - pos < kCentralLen) fail("central directory truncated", at);
    const unsigned char* h = c + pos;
    if (le(h, 4) != kCentralSig) fail("bad central directory entry signature", at);
    const uint64_t flags = le(h + 8, 2), method = le(h + 10, 2);
    const size_t name_len = le(h + 28, 2), extra_len = le(h + 30, 2), comment_len = le(h + 32, 2);
    if (cd.size() - pos - kCentralLen < name_len + extra_len + comment_len)
      fail("central directory entry runs past the directory", at);
    std::string name(reinterpret_cast<const char*>(h + kCentralLen), name_len);
    if (flags & 1) fail("record '" + name + "' is encrypted", at);
    if (method != 0)
      fail("record '" + name + "' is compressed (method " + std::to_string(method) +
               "); torch files store records uncompressed",
           at);
    uint64_t comp = le(h + 20, 4), usize = le(h + 24, 4), local = le(h + 42, 4);
    // ZIP64 extra field (id 1): the 8-byte values of the fields set to 0xFFFFFFFF, in order.
    const unsigned char* x = h + kCentralLen + name_len;
    for (size_t xp = 0; xp + 4 <= extra_len;) {
      const uint64_t id = le(x + xp, 2), len = le(x + xp + 2, 2);
      if (xp + 4 + len > extra_len) fail("extra field of '" + name + "' runs past its entry", at);
      if (id == 1) {
        size_t q = xp + 4;
        for (uint64_t* f : {&usize, &comp, &local}) {
          if (*f != 0xFFFFFFFF) continue;
          if (q + 8 > xp + 4 + len) fail("ZIP64 extra field of '" + name + "' too short", at);
          *f = le(x + q, 8);
          q += 8;
        }
      }
      xp += 4 + len;
    }
    if (comp != usize)
      fail("stored record '" + name + "' has compressed size " + std::to_string(comp) +
               " and size " + std::to_string(usize),
           at);
    if (local > cd_off || cd_off - local < kLocalLen)
      fail("local header of '" + name + "' lies outside the archive", at);
    const std::string lh = get(local, kLocalLen, "local header");
    const auto* lp = reinterpret_cast<const unsigned char*>(lh.data());
    if (le(lp, 4) != kLocalSig) fail("bad local header signature of '" + name + "'", local);
    const uint64_t data = local + kLocalLen + le(lp + 26, 2) + le(lp + 28, 2);
    if (data > cd_off || usize > cd_off - data)
      fail("record '" + name + "' (" + std::to_string(usize) + " bytes) runs past the records",
           local);
    if (get(local + kLocalLen, std::min<uint64_t>(le(lp + 26, 2), cd_off - local - kLocalLen),
            "local name") != name)
      fail("local header names another record than the directory's '" + name + "'", local);
    // torch.save puts every record under one top folder ("archive/data.pkl").
    const auto slash = name.find('/');
    std::string key = slash == std::string::npos ? name : name.substr(slash + 1);
    if (!records_.emplace(key, Record{data, usize, static_cast<uint32_t>(le(h + 16, 4))}).second)
      fail("record '" + name + "' appears twice", at);
    pos += kCentralLen + name_len + extra_len + comment_len;
  }
}

const ZipArchive::Record& ZipArchive::find(const std::string& name) const {
  auto it = records_.find(name);
  if (it == records_.end()) throw CheckpointError("zip archive: no record '" + name + "'");
  return it->second;
}

uint64_t ZipArchive::size(const std::string& name) const {
  return find(name).size;
}

void ZipArchive::read(const std::string& name, void* dst) const {
  const Record& r = find(name);
  if (r.size) read_at_(r.data_offset, r.size, dst);
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(dst);
  // zlib's crc32 takes a uInt length: feed it in pieces below 4 GiB.
  for (uint64_t done = 0; done < r.size;) {
    const uint64_t piece = std::min<uint64_t>(r.size - done, 1u << 30);
    crc = crc32(crc, p + done, static_cast<uInt>(piece));
    done += piece;
  }
  if (static_cast<uint32_t>(crc) != r.crc)
    fail("record '" + name + "' is corrupt (its CRC-32 does not match)", r.data_offset);
}

std::string ZipArchive::read_string(const std::string& name) const {
  std::string s(size(name), '\0');
  read(name, s.data());
  return s;
}

std::vector<std::string> ZipArchive::names() const {
  std::vector<std::string> out;
  for (const auto& [name, r] : records_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dscpp::checkpoint::detail
