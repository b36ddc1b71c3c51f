// preprocess_data: Megatron-LM's tools/preprocess_data.py in C++. Reads JSON lines, tokenises
// the chosen keys with GPT-2's BPE on --workers threads and writes, per key,
// `<output-prefix>_<key>_document.bin/.idx`, byte-identical for any number of workers.
//
// Per line: a JSON object; each key's value is a string (one sequence) or a list of strings
// (one sequence each, empty ones dropped), as Megatron's Encoder.encode; --append-eod adds
// <|endoftext|> to the document's last sequence when it has any token. A document without
// tokens is kept as an empty document (its document index repeats), as Megatron writes it.
// Blank lines are skipped. Progress on stderr (a bar on a terminal, a line per 10% otherwise),
// then a summary. Exit status: 0 done, 1 error (bad input names its line), 2 bad usage.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "dscpp/data/gpt2_tokenizer.h"
#include "dscpp/data/indexed_dataset.h"

namespace po = boost::program_options;
namespace data = dscpp::data;

namespace {

// --workers above this is no count of threads anyone means (a typo); up to it, the count is
// capped at the CPUs this process may run on.
constexpr int kMaxWorkers = 1 << 16;

// The CPUs this process may run on (its affinity mask: a container's or taskset's share).
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

struct Options {
  std::string input;
  std::vector<std::string> json_keys;
  std::string tokenizer_type;
  std::string dataset_impl;  // --dataset-impl: mmap, the only one
  std::string vocab_file;
  std::string merge_file;
  std::string output_prefix;
  bool append_eod = false;
  int workers = 1;
};

// One key of one line: its sequences' tokens back to back, and their lengths.
struct Doc {
  std::vector<int32_t> tokens;
  std::vector<int32_t> lengths;
};

// Lines handed to one worker at a time; written in file order once done.
struct Chunk {
  int64_t first_line = 0;  // 1-based number of lines[0]
  std::vector<std::string> lines;
  size_t bytes = 0;
  std::vector<std::vector<Doc>> docs;  // [line][key]; a blank line has none
  std::exception_ptr error;
  bool done = false;
};

constexpr size_t kChunkLines = 256;
constexpr size_t kChunkBytes = 1 << 20;

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n") == std::string::npos;
}

std::vector<Doc> encode_line(const Options& o, const data::GPT2Tokenizer& tok,
                             data::BpeCache& cache, const std::string& line, int64_t line_no) {
  auto where = [&] { return o.input + ":" + std::to_string(line_no) + ": "; };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(where() + "not a JSON line: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(where() + "not a JSON object");
  std::vector<Doc> docs;
  for (const auto& key : o.json_keys) {
    auto it = j.find(key);
    if (it == j.end()) throw std::runtime_error(where() + "no key '" + key + "'");
    std::vector<const std::string*> sentences;
    if (it->is_string()) {
      sentences.push_back(it->get_ptr<const std::string*>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) throw std::runtime_error(where() + "'" + key + "' lists a non-string");
        sentences.push_back(s.get_ptr<const std::string*>());
      }
    } else {
      throw std::runtime_error(where() + "'" + key + "' is neither a string nor a list of them");
    }
    Doc doc;
    for (const std::string* s : sentences) {
      size_t before = doc.tokens.size();
      tok.encode_into(*s, doc.tokens, &cache);
      if (doc.tokens.size() > before)
        doc.lengths.push_back(static_cast<int32_t>(doc.tokens.size() - before));
    }
    if (o.append_eod && !doc.tokens.empty()) {
      doc.tokens.push_back(tok.eod());
      ++doc.lengths.back();
    }
    docs.push_back(std::move(doc));
  }
  return docs;
}

// Reader thread -> worker threads -> this (writing) thread. Chunks are written in the order
// they were read, whatever order the workers finish them in; at most 4 per worker are in
// flight, which bounds memory.
class Pipeline {
 public:
  Pipeline(const Options& o, const data::GPT2Tokenizer& tok) : o_(o), tok_(tok) {
    in_.open(o.input, std::ios::binary);
    if (!in_) throw std::runtime_error(o.input + ": cannot open the input");
    // A thread the system refuses (a limit on threads or memory) is an error, after the ones
    // started are stopped: a std::thread destroyed while joinable would std::terminate.
    try {
      reader_ = std::thread([this] { read(); });
      for (int w = 0; w < o.workers; ++w) workers_.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      stop();
      throw std::runtime_error(
          "cannot start tokenising thread " + std::to_string(workers_.size() + 1) + " of " +
          std::to_string(o.workers) + ": " + e.what() + " (ask for fewer --workers)");
    }
  }

  ~Pipeline() { stop(); }

  // The next chunk in file order, encoded; null at the end. Rethrows a worker's or the
  // reader's error when the chunk it belongs to comes up.
  std::shared_ptr<Chunk> next() {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [this] {
      return (!pending_.empty() && pending_.front()->done) || (pending_.empty() && read_done_);
    });
    if (pending_.empty()) {
      if (read_error_) std::rethrow_exception(read_error_);
      return nullptr;
    }
    auto chunk = pending_.front();
    pending_.pop_front();
    lock.unlock();
    space_.notify_one();
    if (chunk->error) std::rethrow_exception(chunk->error);
    return chunk;
  }

 private:
  void read() {
    try {
      int64_t line_no = 0;
      std::string line;
      auto chunk = std::make_shared<Chunk>();
      auto submit = [&] {
        std::unique_lock<std::mutex> lock(mutex_);
        space_.wait(lock, [this] {
          return pending_.size() < 4 * static_cast<size_t>(o_.workers) || abort_;
        });
        if (abort_) return false;
        pending_.push_back(chunk);
        todo_.push_back(chunk);
        work_.notify_one();
        chunk = std::make_shared<Chunk>();
        return true;
      };
      while (std::getline(in_, line)) {
        if (chunk->lines.empty()) chunk->first_line = line_no + 1;
        ++line_no;
        chunk->bytes += line.size() + 1;
        chunk->lines.push_back(std::move(line));
        if ((chunk->lines.size() >= kChunkLines || chunk->bytes >= kChunkBytes) && !submit())
          return;
      }
      if (in_.bad()) throw std::runtime_error(o_.input + ": read error");
      if (!chunk->lines.empty() && !submit()) return;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      read_error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    read_done_ = true;
    work_.notify_all();
    finished_.notify_all();
  }

  void work() {
    data::BpeCache cache;
    for (;;) {
      std::shared_ptr<Chunk> chunk;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [this] { return !todo_.empty() || read_done_ || abort_; });
        if (abort_ || todo_.empty()) return;
        chunk = todo_.front();
        todo_.pop_front();
      }
      try {
        chunk->docs.resize(chunk->lines.size());
        for (size_t k = 0; k < chunk->lines.size(); ++k) {
          if (blank(chunk->lines[k])) continue;
          chunk->docs[k] = encode_line(o_, tok_, cache, chunk->lines[k],
                                       chunk->first_line + static_cast<int64_t>(k));
        }
      } catch (...) {
        chunk->error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      chunk->done = true;
      finished_.notify_all();
    }
  }

  // Wakes every thread to leave, and joins those that were started.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      abort_ = true;
    }
    space_.notify_all();
    work_.notify_all();
    if (reader_.joinable()) reader_.join();
    for (auto& t : workers_) t.join();
  }

  const Options& o_;
  const data::GPT2Tokenizer& tok_;
  std::ifstream in_;
  std::mutex mutex_;
  std::condition_variable work_;                // todo_ has a chunk, or reading ended, or abort_
  std::condition_variable space_;               // pending_ has room, or abort_
  std::condition_variable finished_;            // a chunk is done, or reading ended
  std::deque<std::shared_ptr<Chunk>> pending_;  // read, not yet written: file order
  std::deque<std::shared_ptr<Chunk>> todo_;     // read, not yet taken by a worker
  std::exception_ptr read_error_;
  bool read_done_ = false;
  bool abort_ = false;
  std::thread reader_;
  std::vector<std::thread> workers_;
};

std::string si(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

class Progress {
 public:
  explicit Progress(uintmax_t total) : total_(total), tty_(::isatty(STDERR_FILENO) != 0) {}

  void update(uintmax_t bytes, int64_t docs, int64_t tokens, bool last = false) {
    auto now = std::chrono::steady_clock::now();
    double elapsed = std::chrono::duration<double>(now - start_).count();
    double frac =
        total_ ? std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_)) : 1.0;
    if (tty_) {
      if (!last && now - drawn_ < std::chrono::milliseconds(100)) return;
      drawn_ = now;
      const int width = 30, filled = static_cast<int>(frac * width);
      std::fprintf(stderr, "\r[%s%s] %3d%%  %s docs  %s tokens  %s tokens/s ",
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                   static_cast<int>(frac * 100), si(docs).c_str(), si(tokens).c_str(),
                   si(elapsed > 0 ? tokens / elapsed : 0).c_str());
      if (last) std::fputc('\n', stderr);
    } else {
      int step = static_cast<int>(frac * 10);
      if (step <= step_ && !last) return;
      if (last && step_ >= 10) return;
      step_ = step;
      std::fprintf(stderr, "preprocess_data: %3d%%  %lld docs  %lld tokens  %s tokens/s\n",
                   step * 10, static_cast<long long>(docs), static_cast<long long>(tokens),
                   si(elapsed > 0 ? tokens / elapsed : 0).c_str());
    }
    std::fflush(stderr);
  }

 private:
  uintmax_t total_;
  bool tty_;
  int step_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point drawn_{};
};

int run(const Options& o) {
  auto start = std::chrono::steady_clock::now();
  data::GPT2Tokenizer tok(o.vocab_file, o.merge_file);
  if (o.append_eod) tok.eod();  // fail now, not on the first document, if it has none
  const data::DType dtype = data::optimal_token_dtype(std::max(tok.vocab_size(), tok.id_bound()));
  std::vector<std::unique_ptr<data::IndexedDatasetWriter>> writers;
  std::vector<std::string> prefixes;
  for (const auto& key : o.json_keys) {
    prefixes.push_back(o.output_prefix + "_" + key + "_document");
    writers.push_back(std::make_unique<data::IndexedDatasetWriter>(prefixes.back(), dtype));
  }
  std::error_code ec;
  uintmax_t total = std::filesystem::file_size(o.input, ec);
  const auto processing = std::chrono::steady_clock::now();
  Progress progress(ec ? 0 : total);
  int64_t docs = 0, empty = 0, blank_lines = 0, tokens = 0;
  uintmax_t bytes = 0;
  {
    Pipeline pipeline(o, tok);
    while (auto chunk = pipeline.next()) {
      for (const auto& line_docs : chunk->docs) {
        if (line_docs.empty()) {
          ++blank_lines;
          continue;
        }
        for (size_t k = 0; k < line_docs.size(); ++k) {
          const Doc& d = line_docs[k];
          const int32_t* p = d.tokens.data();
          for (int32_t length : d.lengths) {
            writers[k]->add_sequence(p, static_cast<size_t>(length));
            p += length;
          }
          writers[k]->end_document();
          tokens += static_cast<int64_t>(d.tokens.size());
        }
        ++docs;
        if (line_docs[0].tokens.empty()) ++empty;
      }
      bytes += chunk->bytes;
      progress.update(bytes, docs, tokens);
    }
  }
  for (auto& w : writers) w->finish();
  progress.update(bytes, docs, tokens, true);
  auto now = std::chrono::steady_clock::now();
  const double startup = std::chrono::duration<double>(processing - start).count();
  const double seconds = std::chrono::duration<double>(now - processing).count();
  std::fprintf(stderr,
               "preprocess_data: %lld documents (%lld without tokens, %lld blank lines skipped), "
               "%lld tokens in %.2f s: %s tokens/s, %s documents/s, %d worker%s "
               "(start-up %.2f s)\n",
               static_cast<long long>(docs), static_cast<long long>(empty),
               static_cast<long long>(blank_lines), static_cast<long long>(tokens), seconds,
               si(seconds > 0 ? tokens / seconds : 0).c_str(),
               si(seconds > 0 ? docs / seconds : 0).c_str(), o.workers, o.workers == 1 ? "" : "s",
               startup);
  for (const auto& p : prefixes)
    std::fprintf(stderr, "preprocess_data: wrote %s.bin and %s.idx (%s tokens)\n", p.c_str(),
                 p.c_str(), data::dtype_name(dtype));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A reader that closed its end of our progress output (`preprocess_data ... | head`) must
  // not end the run half-way through writing the dataset: the writes fail quietly instead.
  std::signal(SIGPIPE, SIG_IGN);
  Options o;
  po::options_description opts("preprocess_data options (Megatron-LM's names)");
  opts.add_options()("help,h", "show this help")("input", po::value(&o.input)->required(),
                                                 "JSON-lines file, one document a line")(
      "json-keys", po::value(&o.json_keys)->multitoken()->default_value({"text"}, "text"),
      "keys to tokenise; one output per key")(
      "tokenizer-type", po::value(&o.tokenizer_type)->default_value("GPT2BPETokenizer"),
      "GPT2BPETokenizer (Megatron's name) or GPT2Tokenizer (the same BPE, as Hugging Face "
      "names it)")("dataset-impl", po::value(&o.dataset_impl)->default_value("mmap"),
                   "mmap: Megatron's MMapIndexedDataset .bin/.idx, the only one written")(
      "vocab-file", po::value(&o.vocab_file)->required(), "vocabulary: encoder.json / vocab.json")(
      "merge-file", po::value(&o.merge_file)->required(), "merges: vocab.bpe / merges.txt")(
      "output-prefix", po::value(&o.output_prefix)->required(),
      "writes <prefix>_<key>_document.bin/.idx")("append-eod", po::bool_switch(&o.append_eod),
                                                 "end each document with <|endoftext|>")(
      "workers", po::value(&o.workers)->default_value(1), "tokenising threads");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    if (vm.count("help")) {
      std::cout << opts;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "preprocess_data: " << e.what() << "\n" << opts;
    return 2;
  }
  // GPT2Tokenizer is the seed's spelling (Hugging Face's class of the same GPT-2 BPE).
  if (o.tokenizer_type != "GPT2BPETokenizer" && o.tokenizer_type != "GPT2Tokenizer") {
    std::cerr << "preprocess_data: --tokenizer-type " << o.tokenizer_type
              << " is not supported (GPT2BPETokenizer, or its other name GPT2Tokenizer, is)\n";
    return 2;
  }
  // Megatron's older choices: lazy and cached wrote the pre-mmap format, infer read a header.
  if (o.dataset_impl != "mmap") {
    std::cerr << "preprocess_data: --dataset-impl " << o.dataset_impl
              << " is not supported: only mmap (Megatron's MMapIndexedDataset .bin/.idx, what "
                 "train_gpt reads) is written\n";
    return 2;
  }
  if (o.json_keys.empty()) {
    std::cerr << "preprocess_data: need at least one --json-keys\n";
    return 2;
  }
  if (o.workers < 1 || o.workers > kMaxWorkers) {
    std::cerr << "preprocess_data: --workers " << o.workers << ": expected a count of tokenising "
              << "threads from 1 to " << kMaxWorkers << "\n";
    return 2;
  }
  // More threads than CPUs only share them (and each holds a BPE cache and chunks in flight).
  if (const int cpus = usable_cpus(); o.workers > cpus) {
    std::cerr << "preprocess_data: --workers " << o.workers << " is more than the " << cpus
              << " CPU" << (cpus == 1 ? "" : "s") << " this process may run on: using " << cpus
              << "\n";
    o.workers = cpus;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "\npreprocess_data: error: " << e.what() << "\n";
    return 1;
  }
}
