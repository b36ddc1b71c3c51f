// load_torch_file: our files and torch.save's, through our zip reader (zip_reader.h) and
// unpickler (unpickler.h); no LibTorch reader, so that every error is ours.
#include <ATen/ATen.h>

#include <filesystem>
#include <memory>
#include <string>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/torch_file.h"
#include "dscpp/runtime/checkpoint/torch_format.h"
#include "dscpp/runtime/checkpoint/unpickler.h"
#include "dscpp/runtime/checkpoint/zip_reader.h"

namespace dscpp::checkpoint {

namespace detail {

PyValue read_torch_archive(const ZipArchive& zip) {
  if (zip.has("byteorder")) {
    if (zip.size("byteorder") > 16) throw CheckpointError("byteorder record is not 'little'");
    const std::string order = zip.read_string("byteorder");
    if (order != "little") throw CheckpointError("byteorder '" + order + "' not supported");
  }
  if (!zip.has("data.pkl")) throw CheckpointError("no data.pkl record");
  const std::string pkl = zip.read_string("data.pkl");
  return unpickle(pkl, [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    const std::string name = "data/" + key;
    if (!zip.has(name)) throw CheckpointError("record " + name + " is missing");
    const uint64_t size = zip.size(name);
    const uint64_t elem = c10::elementSize(dtype);
    if (static_cast<uint64_t>(numel) > size / elem || size != static_cast<uint64_t>(numel) * elem)
      throw CheckpointError("record " + name + " holds " + std::to_string(size) +
                            " bytes, expected " + std::to_string(numel) + " x " +
                            std::to_string(elem));
    at::Tensor s = at::empty({numel}, at::TensorOptions().dtype(dtype));
    zip.read(name, s.data_ptr());
    return s;
  });
}

}  // namespace detail

PyValue load_torch_file(const std::string& path) {
  try {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) throw CheckpointError("no such file");
    return detail::read_torch_archive(detail::ZipArchive::open_file(path));
  } catch (const std::exception& e) {
    throw CheckpointError("dscpp: cannot read torch file '" + path + "': " + detail::error_text(e));
  }
}

}  // namespace dscpp::checkpoint
