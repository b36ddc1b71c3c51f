// IndexedDatasetWriter and IndexedDataset: Megatron's .bin/.idx pair, byte for byte.
#include "dscpp/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "dscpp/error.h"

namespace dscpp::data {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .bin/.idx files are little-endian and read in place");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderSize = 9 + 8 + 1 + 8 + 8;  // 34

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // the arrays of .idx sit at unaligned offsets
  return v;
}

bool valid_code(uint8_t code) {
  return code >= 1 && code <= 8;
}
bool is_float(DType t) {
  return t == DType::Float32 || t == DType::Float64;
}

std::string system_error() {
  return std::strerror(errno);
}

// Smallest and largest token a dtype holds.
void dtype_range(DType t, int64_t& lo, int64_t& hi) {
  switch (t) {
    case DType::UInt8:
      lo = 0, hi = 255;
      return;
    case DType::Int8:
      lo = -128, hi = 127;
      return;
    case DType::Int16:
      lo = -32768, hi = 32767;
      return;
    case DType::UInt16:
      lo = 0, hi = 65535;
      return;
    case DType::Int32:
      lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
      return;
    default:
      lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  }
}

template <typename Stored>
void widen(const unsigned char* src, int64_t count, int64_t* out) {
  for (int64_t k = 0; k < count; ++k) out[k] = load<Stored>(src + k * sizeof(Stored));
}

template <typename Stored>
void narrow_into(std::string& buffer, int64_t v) {
  Stored s = static_cast<Stored>(v);
  buffer.append(reinterpret_cast<const char*>(&s), sizeof s);
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::UInt8:
    case DType::Int8:
      return 1;
    case DType::Int16:
    case DType::UInt16:
      return 2;
    case DType::Int32:
    case DType::Float32:
      return 4;
    case DType::Int64:
    case DType::Float64:
      return 8;
  }
  throw dscpp::Error("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::UInt8:
      return "uint8";
    case DType::Int8:
      return "int8";
    case DType::Int16:
      return "int16";
    case DType::Int32:
      return "int32";
    case DType::Int64:
      return "int64";
    case DType::Float64:
      return "float64";
    case DType::Float32:
      return "float32";
    case DType::UInt16:
      return "uint16";
  }
  return "unknown";
}

DType optimal_token_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? DType::UInt16 : DType::Int32;
}

std::string bin_path(const std::string& prefix) {
  return prefix + ".bin";
}
std::string idx_path(const std::string& prefix) {
  return prefix + ".idx";
}

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, DType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  if (!valid_code(static_cast<uint8_t>(dtype)) || is_float(dtype))
    throw dscpp::Error(bin_path(prefix_) + ": tokens need an integer dtype, not " +
                       dtype_name(dtype));
  std::string tmp = bin_path(prefix_) + ".tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  if (!bin_) throw dscpp::Error(tmp + ": cannot create: " + system_error());
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (finished_) return;
  if (bin_) std::fclose(bin_);
  std::remove((bin_path(prefix_) + ".tmp").c_str());
  std::remove((idx_path(prefix_) + ".tmp").c_str());
}

template <typename T>
void IndexedDatasetWriter::add(const T* tokens, size_t count) {
  if (finished_) throw dscpp::Error(bin_path(prefix_) + ": add after finish()");
  if (count > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw dscpp::Error(bin_path(prefix_) + ": a sequence of " + std::to_string(count) +
                       " tokens exceeds the int32 length field");
  int64_t lo, hi;
  dtype_range(dtype_, lo, hi);
  for (size_t k = 0; k < count; ++k) {
    auto v = static_cast<int64_t>(tokens[k]);
    if (v < lo || v > hi)
      throw dscpp::Error(bin_path(prefix_) + ": token " + std::to_string(v) +
                         " does not fit dtype " + dtype_name(dtype_));
    switch (dtype_) {
      case DType::UInt8:
        narrow_into<uint8_t>(buffer_, v);
        break;
      case DType::Int8:
        narrow_into<int8_t>(buffer_, v);
        break;
      case DType::Int16:
        narrow_into<int16_t>(buffer_, v);
        break;
      case DType::UInt16:
        narrow_into<uint16_t>(buffer_, v);
        break;
      case DType::Int32:
        narrow_into<int32_t>(buffer_, v);
        break;
      default:
        narrow_into<int64_t>(buffer_, v);
    }
  }
  lengths_.push_back(static_cast<int32_t>(count));
  tokens_ += static_cast<int64_t>(count);
  if (buffer_.size() >= (1u << 20)) flush();
}

void IndexedDatasetWriter::add_sequence(const int32_t* tokens, size_t count) {
  add(tokens, count);
}
void IndexedDatasetWriter::add_sequence(const int64_t* tokens, size_t count) {
  add(tokens, count);
}

void IndexedDatasetWriter::end_document() {
  if (finished_) throw dscpp::Error(bin_path(prefix_) + ": add after finish()");
  doc_index_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::add_document(const std::vector<int32_t>& tokens) {
  if (!tokens.empty()) add(tokens.data(), tokens.size());
  end_document();
}

void IndexedDatasetWriter::flush() {
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size())
    throw dscpp::Error(bin_path(prefix_) + ".tmp: write failed: " + system_error());
  buffer_.clear();
}

void IndexedDatasetWriter::finish() {
  if (finished_) return;
  // Sequences after the last end_document() form a last document, or the index would be
  // unreadable (Megatron requires doc[D] == S).
  if (doc_index_.back() != num_sequences()) end_document();
  flush();
  std::string bin_tmp = bin_path(prefix_) + ".tmp", idx_tmp = idx_path(prefix_) + ".tmp";
  bool ok = std::fflush(bin_) == 0 && ::fsync(::fileno(bin_)) == 0;
  ok = (std::fclose(bin_) == 0) && ok;
  bin_ = nullptr;
  if (!ok) throw dscpp::Error(bin_tmp + ": write failed: " + system_error());

  std::string idx;
  idx.append(kMagic, sizeof kMagic);
  auto put = [&idx](const auto& v) { idx.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint64_t{1});
  put(static_cast<uint8_t>(dtype_));
  put(static_cast<uint64_t>(lengths_.size()));
  put(static_cast<uint64_t>(doc_index_.size()));
  idx.append(reinterpret_cast<const char*>(lengths_.data()), lengths_.size() * sizeof(int32_t));
  const int64_t item = static_cast<int64_t>(dtype_size(dtype_));
  int64_t pointer = 0;
  for (int32_t length : lengths_) {
    put(pointer);
    pointer += length * item;
  }
  idx.append(reinterpret_cast<const char*>(doc_index_.data()), doc_index_.size() * sizeof(int64_t));

  std::FILE* f = std::fopen(idx_tmp.c_str(), "wb");
  if (!f) throw dscpp::Error(idx_tmp + ": cannot create: " + system_error());
  ok = std::fwrite(idx.data(), 1, idx.size(), f) == idx.size() && std::fflush(f) == 0 &&
       ::fsync(::fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw dscpp::Error(idx_tmp + ": write failed: " + system_error());
  if (std::rename(bin_tmp.c_str(), bin_path(prefix_).c_str()) != 0)
    throw dscpp::Error(bin_path(prefix_) + ": cannot rename into place: " + system_error());
  if (std::rename(idx_tmp.c_str(), idx_path(prefix_).c_str()) != 0)
    throw dscpp::Error(idx_path(prefix_) + ": cannot rename into place: " + system_error());
  finished_ = true;
}

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

IndexedDataset::Mapping::Mapping(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw dscpp::Error(path + ": cannot open: " + system_error());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string e = system_error();
    ::close(fd);
    throw dscpp::Error(path + ": cannot stat: " + e);
  }
  size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      std::string e = system_error();
      ::close(fd);
      throw dscpp::Error(path + ": cannot mmap: " + e);
    }
    data = static_cast<const unsigned char*>(p);
  }
  ::close(fd);  // the mapping keeps the file
}

IndexedDataset::Mapping::~Mapping() {
  if (data) ::munmap(const_cast<unsigned char*>(data), size);
}

namespace {
[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw dscpp::Error(path + ": " + problem);
}
}  // namespace

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix), idx_(idx_path(prefix)), bin_(bin_path(prefix)) {
  const std::string ipath = idx_path(prefix), bpath = bin_path(prefix);
  if (idx_.size < kHeaderSize)
    fail(ipath, "truncated index: " + std::to_string(idx_.size) + " bytes, the header alone is " +
                    std::to_string(kHeaderSize));
  if (std::memcmp(idx_.data, kMagic, sizeof kMagic) != 0)
    fail(ipath, "bad magic: not a Megatron indexed dataset index (MMIDIDX)");
  auto version = load<uint64_t>(idx_.data + 9);
  if (version != 1) fail(ipath, "unsupported version " + std::to_string(version) + " (not 1)");
  uint8_t code = idx_.data[17];
  if (!valid_code(code)) fail(ipath, "unknown dtype code " + std::to_string(code));
  dtype_ = static_cast<DType>(code);
  if (is_float(dtype_))
    fail(ipath, std::string("dtype ") + dtype_name(dtype_) + " does not hold tokens");
  auto s = load<uint64_t>(idx_.data + 18), d1 = load<uint64_t>(idx_.data + 26);
  // Counts past 2^40 cannot be honest: reject them before they overflow the size check.
  if (s > (uint64_t{1} << 40) || d1 > (uint64_t{1} << 40))
    fail(ipath, "implausible counts: " + std::to_string(s) + " sequences, " + std::to_string(d1) +
                    " document indices");
  uint64_t need = kHeaderSize + s * (4 + 8) + d1 * 8;
  if (idx_.size < need)
    fail(ipath, "truncated index: " + std::to_string(idx_.size) + " bytes, " + std::to_string(s) +
                    " sequences and " + std::to_string(d1) + " document indices need " +
                    std::to_string(need));
  num_sequences_ = static_cast<int64_t>(s);
  num_doc_entries_ = static_cast<int64_t>(d1);
  lengths_ = idx_.data + kHeaderSize;
  pointers_ = lengths_ + s * 4;
  doc_index_ = pointers_ + s * 8;

  if (d1 < 1 || document_index(0) != 0) fail(ipath, "document indices must start with 0");
  for (int64_t d = 1; d < num_doc_entries_; ++d)
    if (document_index(d) < document_index(d - 1))
      fail(ipath, "document indices decrease at entry " + std::to_string(d));
  if (document_index(num_doc_entries_ - 1) != num_sequences_)
    fail(ipath, "the last document index is " +
                    std::to_string(document_index(num_doc_entries_ - 1)) + ", not the " +
                    std::to_string(num_sequences_) + " sequences");
  const auto item = static_cast<int64_t>(dtype_size(dtype_));
  const auto bin_size = static_cast<int64_t>(bin_.size);
  for (int64_t i = 0; i < num_sequences_; ++i) {
    int64_t length = sequence_length(i), pointer = sequence_pointer(i);
    if (length < 0) fail(ipath, "sequence " + std::to_string(i) + " has a negative length");
    if (pointer < 0 || pointer > bin_size || length > (bin_size - pointer) / item)
      fail(bpath, "truncated data: sequence " + std::to_string(i) + " (" + std::to_string(length) +
                      " tokens at byte " + std::to_string(pointer) +
                      ") lies past the file's end (" + std::to_string(bin_size) + " bytes)");
    num_tokens_ += length;
  }
}

int32_t IndexedDataset::sequence_length(int64_t i) const {
  return load<int32_t>(lengths_ + static_cast<size_t>(i) * 4);
}

int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  return load<int64_t>(pointers_ + static_cast<size_t>(i) * 8);
}

int64_t IndexedDataset::document_index(int64_t d) const {
  return load<int64_t>(doc_index_ + static_cast<size_t>(d) * 8);
}

void IndexedDataset::read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const {
  if (seq < 0 || seq >= num_sequences_ || offset < 0 || count < 0 ||
      offset + count > sequence_length(seq))
    throw dscpp::Error(bin_path(prefix_) + ": tokens [" + std::to_string(offset) + ", " +
                       std::to_string(offset + count) + ") of sequence " + std::to_string(seq) +
                       " are out of range");
  const unsigned char* src =
      bin_.data + sequence_pointer(seq) + offset * static_cast<int64_t>(dtype_size(dtype_));
  switch (dtype_) {
    case DType::UInt8:
      widen<uint8_t>(src, count, out);
      break;
    case DType::Int8:
      widen<int8_t>(src, count, out);
      break;
    case DType::Int16:
      widen<int16_t>(src, count, out);
      break;
    case DType::UInt16:
      widen<uint16_t>(src, count, out);
      break;
    case DType::Int32:
      widen<int32_t>(src, count, out);
      break;
    default:
      widen<int64_t>(src, count, out);
  }
}

std::vector<int64_t> IndexedDataset::sequence(int64_t seq) const {
  if (seq < 0 || seq >= num_sequences_)
    throw dscpp::Error(bin_path(prefix_) + ": no sequence " + std::to_string(seq));
  std::vector<int64_t> out(static_cast<size_t>(sequence_length(seq)));
  read(seq, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

}  // namespace dscpp::data
