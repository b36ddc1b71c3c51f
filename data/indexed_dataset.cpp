// IndexedDatasetWriter and IndexedDataset: Megatron's .bin/.idx pair, byte for byte.
#include "dscpp/data/indexed_dataset.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "dscpp/data/data_error.h"
#include "dscpp/data/input_file.h"

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
  throw Error("unknown dtype code " + std::to_string(static_cast<int>(t)));
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
    throw DataError(bin_path(prefix_),
                    std::string("tokens need an integer dtype, not ") + dtype_name(dtype));
  std::string tmp = bin_path(prefix_) + ".tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  if (!bin_) throw DataError(tmp, "cannot create: " + system_error());
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (finished_) return;
  if (bin_) std::fclose(bin_);
  std::remove((bin_path(prefix_) + ".tmp").c_str());
  std::remove((idx_path(prefix_) + ".tmp").c_str());
}

template <typename T>
void IndexedDatasetWriter::add(const T* tokens, size_t count) {
  if (finished_) throw DataError(bin_path(prefix_), "add after finish()");
  if (count > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw DataError(bin_path(prefix_), "a sequence of " + std::to_string(count) +
                                           " tokens exceeds the int32 length field");
  int64_t lo, hi;
  dtype_range(dtype_, lo, hi);
  for (size_t k = 0; k < count; ++k) {
    auto v = static_cast<int64_t>(tokens[k]);
    if (v < lo || v > hi)
      throw DataError(bin_path(prefix_),
                      "token " + std::to_string(v) + " does not fit dtype " + dtype_name(dtype_));
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
  if (finished_) throw DataError(bin_path(prefix_), "add after finish()");
  doc_index_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::add_document(const std::vector<int32_t>& tokens) {
  if (!tokens.empty()) add(tokens.data(), tokens.size());
  end_document();
}

void IndexedDatasetWriter::flush() {
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size())
    throw DataError(bin_path(prefix_) + ".tmp", "write failed: " + system_error());
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
  if (!ok) throw DataError(bin_tmp, "write failed: " + system_error());

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
  if (!f) throw DataError(idx_tmp, "cannot create: " + system_error());
  ok = std::fwrite(idx.data(), 1, idx.size(), f) == idx.size() && std::fflush(f) == 0 &&
       ::fsync(::fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw DataError(idx_tmp, "write failed: " + system_error());
  if (std::rename(bin_tmp.c_str(), bin_path(prefix_).c_str()) != 0)
    throw DataError(bin_path(prefix_), "cannot rename into place: " + system_error());
  if (std::rename(idx_tmp.c_str(), idx_path(prefix_).c_str()) != 0)
    throw DataError(idx_path(prefix_), "cannot rename into place: " + system_error());
  finished_ = true;
}

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

IndexedDataset::Mapping::Mapping(const std::string& path) : owned(true) {
  int fd = open_regular_file(path, size);
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      std::string e = system_error();
      ::close(fd);
      throw DataError(path, "cannot mmap: " + e);
    }
    data = static_cast<const unsigned char*>(p);
  }
  ::close(fd);  // the mapping keeps the file
}

IndexedDataset::Mapping::~Mapping() {
  if (owned && data) ::munmap(const_cast<unsigned char*>(data), size);
}

namespace {

std::string at_byte(uint64_t offset) {
  return "byte " + std::to_string(offset);
}

// a * b + c, or false when it does not fit in 64 bits.
bool mul_add(uint64_t a, uint64_t b, uint64_t c, uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out) && !__builtin_add_overflow(out, c, &out);
}

}  // namespace

uint64_t IndexedDataset::index_size(const unsigned char* idx, size_t size) {
  if (size < kHeaderSize) return 0;
  auto s = load<uint64_t>(idx + 18), d1 = load<uint64_t>(idx + 26);
  uint64_t arrays = 0, need = 0;
  if (!mul_add(s, 4 + 8, kHeaderSize, arrays) || !mul_add(d1, 8, arrays, need)) return 0;
  return need;
}

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix), idx_(idx_path(prefix)), bin_(bin_path(prefix)) {
  check_index();
}

IndexedDataset::IndexedDataset(std::string prefix, const unsigned char* idx, size_t idx_size,
                               const unsigned char* bin, size_t bin_size)
    : prefix_(std::move(prefix)), idx_(idx, idx_size), bin_(bin, bin_size) {
  check_index();
}

// Every field is checked against the file sizes before anything is read through it, with
// overflow-checked arithmetic: no allocation and no pointer comes from an unchecked count.
void IndexedDataset::check_index() {
  const std::string ipath = idx_path(prefix_), bpath = bin_path(prefix_);
  if (idx_.size < kHeaderSize)
    throw DataError(ipath, "truncated index: " + std::to_string(idx_.size) +
                               " bytes, the header alone is " + std::to_string(kHeaderSize));
  if (std::memcmp(idx_.data, kMagic, sizeof kMagic) != 0)
    throw DataError(ipath, at_byte(0), "bad magic: not a Megatron indexed dataset index (MMIDIDX)");
  auto version = load<uint64_t>(idx_.data + 9);
  if (version != 1)
    throw DataError(ipath, at_byte(9),
                    "unsupported version " + std::to_string(version) + " (not 1)");
  uint8_t code = idx_.data[17];
  if (!valid_code(code))
    throw DataError(ipath, at_byte(17), "unknown dtype code " + std::to_string(code));
  dtype_ = static_cast<DType>(code);
  if (is_float(dtype_))
    throw DataError(ipath, at_byte(17),
                    std::string("dtype ") + dtype_name(dtype_) + " does not hold tokens");
  auto s = load<uint64_t>(idx_.data + 18), d1 = load<uint64_t>(idx_.data + 26);
  const uint64_t need = index_size(idx_.data, idx_.size);
  if (need == 0 || idx_.size < need)
    throw DataError(ipath, "truncated index: " + std::to_string(idx_.size) + " bytes, but " +
                               std::to_string(s) + " sequences and " + std::to_string(d1) +
                               " document indices need " +
                               (need == 0 ? std::string("more than 2^64") : std::to_string(need)));
  // need <= idx_.size bounds s and d1 far below 2^63: the casts and offsets below are exact.
  num_sequences_ = static_cast<int64_t>(s);
  num_doc_entries_ = static_cast<int64_t>(d1);
  lengths_ = idx_.data + kHeaderSize;
  pointers_ = lengths_ + s * 4;
  doc_index_ = pointers_ + s * 8;
  const uint64_t doc_at = kHeaderSize + s * 12;
  auto doc_byte = [&](int64_t d) { return at_byte(doc_at + static_cast<uint64_t>(d) * 8); };

  if (d1 < 1) throw DataError(ipath, at_byte(26), "no document indices (at least the 0 is needed)");
  if (document_index(0) != 0)
    throw DataError(ipath, doc_byte(0),
                    "document indices must start with 0, not " + std::to_string(document_index(0)));
  for (int64_t d = 1; d < num_doc_entries_; ++d)
    if (document_index(d) < document_index(d - 1))
      throw DataError(ipath, doc_byte(d),
                      "document indices decrease at entry " + std::to_string(d) + " (" +
                          std::to_string(document_index(d - 1)) + ", then " +
                          std::to_string(document_index(d)) + ")");
  if (document_index(num_doc_entries_ - 1) != num_sequences_)
    throw DataError(ipath, doc_byte(num_doc_entries_ - 1),
                    "the last document index is " +
                        std::to_string(document_index(num_doc_entries_ - 1)) + ", not the " +
                        std::to_string(num_sequences_) + " sequences");
  const uint64_t item = dtype_size(dtype_), bin_size = bin_.size;
  // What a pointer that is not the previous sequence's end is told: where that end is, and
  // the width the pointers step by when it is a token width other than the dtype's.
  auto not_back_to_back = [&](int64_t i, int64_t pointer, uint64_t end, int64_t previous_length,
                              int64_t previous_pointer) {
    std::string m = "sequence " + std::to_string(i) + " starts at byte " + std::to_string(pointer) +
                    " of " + bpath + ", not at " + std::to_string(end) +
                    (i == 0 ? std::string(" (the first sequence starts the file)")
                            : " where sequence " + std::to_string(i - 1) + " (" +
                                  std::to_string(previous_length) + " tokens of " +
                                  std::to_string(item) + " bytes) ends") +
                    ": the sequences must lie back to back, as Megatron writes them";
    const int64_t step = pointer - previous_pointer;
    if (i > 0 && previous_length > 0 && step > 0 && step % previous_length == 0) {
      const int64_t width = step / previous_length;
      if (width != static_cast<int64_t>(item) &&
          (width == 1 || width == 2 || width == 4 || width == 8))
        m += "; the pointers step by " + std::to_string(width) +
             " bytes a token, but the dtype code (" + at_byte(17) + ") says " + dtype_name(dtype_) +
             " (" + std::to_string(item) + ")";
    }
    return m;
  };
  uint64_t expected = 0;  // where the next sequence starts: the end of the one before
  for (int64_t i = 0; i < num_sequences_; ++i) {
    const auto u = static_cast<uint64_t>(i);
    int64_t length = sequence_length(i), pointer = sequence_pointer(i);
    if (length < 0)
      throw DataError(
          ipath, at_byte(kHeaderSize + u * 4),
          "sequence " + std::to_string(i) + " has a negative length, " + std::to_string(length));
    if (pointer < 0)
      throw DataError(
          ipath, at_byte(kHeaderSize + s * 4 + u * 8),
          "sequence " + std::to_string(i) + " has a negative pointer, " + std::to_string(pointer));
    uint64_t end = 0;
    if (!mul_add(static_cast<uint64_t>(length), item, static_cast<uint64_t>(pointer), end) ||
        end > bin_size)
      throw DataError(bpath, "truncated data: sequence " + std::to_string(i) + " (" +
                                 std::to_string(length) + " tokens at byte " +
                                 std::to_string(pointer) + ") lies past the file's end (" +
                                 std::to_string(bin_size) + " bytes)");
    // Megatron's writer puts the sequences back to back from byte 0, so each pointer is the
    // end of the one before. A pointer elsewhere is an aliased or corrupted entry, or a dtype
    // code that does not match the .bin (the pointers then step by another width).
    if (pointer != static_cast<int64_t>(expected))
      throw DataError(ipath, at_byte(kHeaderSize + s * 4 + u * 8),
                      not_back_to_back(i, pointer, expected, i > 0 ? sequence_length(i - 1) : 0,
                                       i > 0 ? sequence_pointer(i - 1) : 0));
    expected = end;
    // end <= bin_size bounds the sum of the lengths: no overflow.
    num_tokens_ += length;
  }
  // The .bin holds exactly the sequences: a longer one is another corpus's beside this index
  // (or this index is another's, shorter), and its tokens past the index would go unread.
  if (expected != bin_size)
    throw DataError(bpath, std::to_string(bin_size) + " bytes, but its index " + ipath +
                               " describes " + std::to_string(num_sequences_) + " sequences of " +
                               std::to_string(num_tokens_) + " tokens in " + dtype_name(dtype_) +
                               " (" + std::to_string(item) +
                               " bytes each) = " + std::to_string(expected) +
                               " bytes: the two files are not a pair (an index from another "
                               "corpus, or a truncated or appended-to .bin)");
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

namespace {

// The first of `count` tokens at `src` outside [0, bound), or -1.
template <typename Stored>
int64_t first_outside(const unsigned char* src, int64_t count, int64_t bound) {
  for (int64_t k = 0; k < count; ++k) {
    auto v = static_cast<int64_t>(load<Stored>(src + k * static_cast<int64_t>(sizeof(Stored))));
    if (v < 0 || v >= bound) return k;
  }
  return -1;
}

}  // namespace

void IndexedDataset::read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const {
  // Compared without forming offset + count, which may overflow for hostile arguments.
  if (seq < 0 || seq >= num_sequences_ || offset < 0 || count < 0 ||
      offset > sequence_length(seq) || count > sequence_length(seq) - offset)
    throw DataError(bin_path(prefix_), "tokens [" + std::to_string(offset) + ", +" +
                                           std::to_string(count) + ") of sequence " +
                                           std::to_string(seq) + " are out of range");
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
    throw DataError(bin_path(prefix_), "no sequence " + std::to_string(seq) + " (the dataset has " +
                                           std::to_string(num_sequences_) + ")");
  std::vector<int64_t> out(static_cast<size_t>(sequence_length(seq)));
  read(seq, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

void IndexedDataset::check_token_ids(int64_t vocab_size) const {
  if (vocab_size < 1)
    throw DataError(bin_path(prefix_),
                    "vocab_size must be >= 1, got " + std::to_string(vocab_size));
  int64_t lo, hi;
  dtype_range(dtype_, lo, hi);
  // A vocabulary the dtype cannot hold: the ids above it could not have been written, so the
  // dtype code is not the one the file was written with. (Padding a vocabulary of fewer than
  // 2^k ids to a power-of-two multiple never passes 2^k, so a padded model vocabulary is no
  // false alarm.)
  if (vocab_size - 1 > hi)
    throw DataError(idx_path(prefix_), at_byte(17),
                    std::string("dtype ") + dtype_name(dtype_) + " holds token ids up to " +
                        std::to_string(hi) + ", but the vocabulary has " +
                        std::to_string(vocab_size) +
                        ": the dtype code does not match the tokenizer the data was written "
                        "with (Megatron writes uint16 for a vocabulary under 65500, int32 above)");
  if (lo >= 0 && hi < vocab_size) return;  // every value of the dtype is a valid id
  const int64_t item = static_cast<int64_t>(dtype_size(dtype_));
  for (int64_t d = 0; d + 1 < num_doc_entries_; ++d) {
    for (int64_t seq = document_index(d); seq < document_index(d + 1); ++seq) {
      const unsigned char* src = bin_.data + sequence_pointer(seq);
      const int64_t n = sequence_length(seq);
      int64_t k = -1;
      switch (dtype_) {
        case DType::UInt8:
          k = first_outside<uint8_t>(src, n, vocab_size);
          break;
        case DType::Int8:
          k = first_outside<int8_t>(src, n, vocab_size);
          break;
        case DType::Int16:
          k = first_outside<int16_t>(src, n, vocab_size);
          break;
        case DType::UInt16:
          k = first_outside<uint16_t>(src, n, vocab_size);
          break;
        case DType::Int32:
          k = first_outside<int32_t>(src, n, vocab_size);
          break;
        default:
          k = first_outside<int64_t>(src, n, vocab_size);
      }
      if (k < 0) continue;
      int64_t id = 0;
      read(seq, k, 1, &id);
      throw DataError(bin_path(prefix_),
                      "document " + std::to_string(d) + ", sequence " + std::to_string(seq) +
                          ", token " + std::to_string(k) + " (" +
                          at_byte(static_cast<uint64_t>(sequence_pointer(seq) + k * item)) + ")",
                      "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                          std::to_string(vocab_size) + ")");
    }
  }
}

}  // namespace dscpp::data
