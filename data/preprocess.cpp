#include "data/preprocess.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <ostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text.h"
#include "data/indexed_dataset.h"

namespace fp8tron::data {
namespace {

using Clock = std::chrono::steady_clock;

// One JSON key of one document: its tokens and the length of each non-empty sentence.
struct Encoded {
  std::vector<int64_t> ids;
  std::vector<int32_t> lengths;
};

struct Batch {
  int64_t first_line = 0;  // 1-based line number of lines[0], for error messages
  std::vector<std::string> lines;
  // Filled by a worker: per non-blank line, one Encoded per key.
  std::vector<std::vector<Encoded>> documents;
  int64_t bytes = 0, blank = 0;
};

constexpr size_t kBatchLines = 64;

bool is_blank(const std::string& line) { return line.find_first_not_of(" \t\r\n") == std::string::npos; }

// Encoder.encode: every sentence is tokenized, empty results dropped, eod appended to a non-empty
// document; a document that is a string is one sentence, a list is its sentences.
Encoded encode_value(const nlohmann::json& value, const Tokenizer& tokenizer, bool append_eod, const std::string& where) {
  Encoded out;
  const auto add = [&](const nlohmann::json& sentence) {
    if (!sentence.is_string()) throw UserError(where + " is not a string or a list of strings");
    auto ids = tokenizer.tokenize(sentence.get_ref<const std::string&>());
    if (ids.empty()) return;
    out.lengths.push_back(int32_t(ids.size()));
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  };
  if (value.is_array()) {
    for (const auto& s : value) add(s);
  } else {
    add(value);
  }
  if (append_eod && !out.ids.empty()) {
    out.ids.push_back(tokenizer.eod());
    out.lengths.back() += 1;
  }
  return out;
}

void encode_batch(Batch& batch, const PreprocessOptions& o, const Tokenizer& tokenizer) {
  for (size_t i = 0; i < batch.lines.size(); ++i) {
    const std::string& line = batch.lines[i];
    batch.bytes += int64_t(line.size()) + 1;
    if (is_blank(line)) {
      ++batch.blank;
      continue;
    }
    const std::string where = strprintf("%s line %lld", o.input.c_str(), (long long)(batch.first_line + int64_t(i)));
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw UserError(strprintf("%s is not valid JSON: %s", where.c_str(), e.what()));
    }
    std::vector<Encoded> keys;
    for (const std::string& key : o.json_keys) {
      if (!doc.is_object() || !doc.contains(key))
        throw UserError(strprintf("%s has no key \"%s\" (choose keys with --json-keys)", where.c_str(), key.c_str()));
      keys.push_back(encode_value(doc[key], tokenizer, o.append_eod, where + " key \"" + key + "\""));
    }
    batch.documents.push_back(std::move(keys));
  }
  batch.lines.clear();
  batch.lines.shrink_to_fit();
}

// Batches flow reader -> workers -> writer; results come back keyed by batch number so the writer
// can take them in order. At most `capacity` batches are in flight, which bounds memory.
class Pipeline {
 public:
  explicit Pipeline(size_t capacity) : capacity_(capacity) {}

  // Reader side: blocks while too many batches are in flight. False once the pipeline failed.
  bool submit(int64_t index, Batch batch) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return in_flight_ < capacity_ || failed_; });
    if (failed_) return false;
    ++in_flight_;
    todo_.emplace_back(index, std::move(batch));
    cv_.notify_all();
    return true;
  }
  // Reader side: no more batches; `count` were submitted.
  void close_input(int64_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    input_closed_ = true;
    batches_ = count;
    cv_.notify_all();
  }
  // Worker side: the next batch to encode, or nullopt when there is no more work.
  std::optional<std::pair<int64_t, Batch>> take() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !todo_.empty() || input_closed_ || failed_; });
    if (todo_.empty() || failed_) return std::nullopt;
    auto item = std::move(todo_.front());
    todo_.pop_front();
    return item;
  }
  void finish(int64_t index, Batch batch) {
    std::lock_guard<std::mutex> lock(mutex_);
    done_.emplace(index, std::move(batch));
    cv_.notify_all();
  }
  // Writer side: batch `index` once encoded; nullopt past the last batch or after a failure.
  std::optional<Batch> result(int64_t index) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done_.count(index) || failed_ || (input_closed_ && index >= batches_); });
    if (failed_ || !done_.count(index)) return std::nullopt;
    Batch b = std::move(done_.at(index));
    done_.erase(index);
    --in_flight_;
    cv_.notify_all();
    return b;
  }
  void fail(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = error;
    failed_ = true;
    cv_.notify_all();
  }
  std::exception_ptr error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 private:
  size_t capacity_, in_flight_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, Batch>> todo_;
  std::map<int64_t, Batch> done_;
  bool input_closed_ = false, failed_ = false;
  int64_t batches_ = 0;
  std::exception_ptr error_;
};

// Reads the input in batches; returns the number of batches submitted.
int64_t read_input(std::istream& in, Pipeline& pipeline) {
  int64_t index = 0, line_number = 1;
  Batch batch;
  batch.first_line = line_number;
  std::string line;
  while (std::getline(in, line)) {
    batch.lines.push_back(std::move(line));
    ++line_number;
    if (batch.lines.size() == kBatchLines) {
      if (!pipeline.submit(index++, std::move(batch))) return index;
      batch = Batch();
      batch.first_line = line_number;
    }
  }
  if (!batch.lines.empty() && pipeline.submit(index, std::move(batch))) ++index;
  return index;
}

void log_progress(std::ostream& log, int64_t documents, int64_t bytes, Clock::time_point start) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  log << strprintf("Processed %lld documents (%.1f docs/s, %.2f MB/s).", (long long)documents, documents / elapsed,
                   bytes / elapsed / 1024 / 1024)
      << std::endl;
}

// The output datasets' files under temporary names (<name>.partial): commit() renames them into
// place, the .bin before its .idx (a dataset is opened by its .idx); destroyed uncommitted, it
// removes them.
class PartialOutputs {
 public:
  void add(const std::string& prefix) { prefixes_.push_back(prefix); }
  std::string bin(size_t k) const { return bin_path(prefixes_[k]) + ".partial"; }
  std::string idx(size_t k) const { return idx_path(prefixes_[k]) + ".partial"; }
  void commit() {
    for (size_t k = 0; k < prefixes_.size(); ++k) {
      rename_into_place(bin(k), bin_path(prefixes_[k]));
      rename_into_place(idx(k), idx_path(prefixes_[k]));
    }
    committed_ = true;
  }
  ~PartialOutputs() {
    if (committed_) return;
    for (size_t k = 0; k < prefixes_.size(); ++k) {
      std::remove(bin(k).c_str());
      std::remove(idx(k).c_str());
    }
  }

 private:
  static void rename_into_place(const std::string& from, const std::string& to) {
    if (std::rename(from.c_str(), to.c_str()) != 0)
      throw UserError(strprintf("cannot rename %s to %s: %s", from.c_str(), to.c_str(), std::strerror(errno)));
  }
  std::vector<std::string> prefixes_;
  bool committed_ = false;
};

// The writer: appends the encoded batches to the datasets in input order.
void write_in_order(Pipeline& pipeline, std::vector<std::unique_ptr<IndexedDatasetBuilder>>& builders,
                    int64_t log_interval, std::ostream& log, PreprocessStats& stats) {
  const auto start = Clock::now();
  for (int64_t b = 0;; ++b) {
    auto batch = pipeline.result(b);
    if (!batch) return;
    stats.bytes += batch->bytes;
    stats.blank_lines += batch->blank;
    for (const auto& doc : batch->documents) {
      for (size_t k = 0; k < doc.size(); ++k) {
        builders[k]->add_document(doc[k].ids.data(), int64_t(doc[k].ids.size()), doc[k].lengths);
        stats.tokens[k] += int64_t(doc[k].ids.size());
      }
      if (++stats.documents % log_interval == 0) log_progress(log, stats.documents, stats.bytes, start);
    }
  }
}

}  // namespace

std::string preprocess_output_prefix(const std::string& prefix, const std::string& key) {
  return prefix + "_" + key + "_document";
}

PreprocessStats preprocess(const PreprocessOptions& o, std::ostream& log) {
  if (o.input.empty()) throw UserError("--input is required (a JSONL file, one JSON document per line)");
  if (o.output_prefix.empty()) throw UserError("--output-prefix is required");
  if (o.workers < 1) throw UserError(strprintf("--workers %d: need at least one worker", o.workers));
  if (o.json_keys.empty()) throw UserError("--json-keys needs at least one key");
  if (o.log_interval < 1) throw UserError("--log-interval must be positive");

  const auto startup = Clock::now();
  std::error_code ec;
  if (std::filesystem::is_directory(o.input, ec))
    throw UserError(strprintf("--input %s is a directory; give one JSONL file (run once per file)", o.input.c_str()));
  std::ifstream in(o.input, std::ios::binary);
  if (!in) throw UserError(strprintf("cannot open --input %s", o.input.c_str()));
  log << "Opening " << o.input << std::endl;
  const auto tokenizer = build_tokenizer(o.tokenizer);
  if (o.append_eod) tokenizer->eod();  // fails early when the tokenizer has no end-of-document token
  const DType dtype = optimal_dtype(tokenizer->vocab_size());
  // Written under temporary names and renamed into place at the end: a failure (or a kill) leaves
  // no .bin/.idx pair that looks like a dataset.
  PartialOutputs outputs;
  for (const auto& key : o.json_keys) outputs.add(preprocess_output_prefix(o.output_prefix, key));
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (size_t k = 0; k < o.json_keys.size(); ++k)
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(outputs.bin(k), dtype));
  log << strprintf("Time to startup: %.3f", std::chrono::duration<double>(Clock::now() - startup).count()) << std::endl;

  PreprocessStats stats;
  stats.tokens.assign(o.json_keys.size(), 0);
  const auto start = Clock::now();
  Pipeline pipeline(size_t(4 * o.workers + 4));
  std::vector<std::thread> threads;
  // A thread the system cannot start fails the pipeline, so the ones already running end and are
  // joined before the error is reported (a joinable thread destroyed would abort the process).
  auto start_thread = [&](auto body) {
    try {
      threads.emplace_back(body);
    } catch (const std::system_error& e) {
      pipeline.fail(std::make_exception_ptr(UserError(strprintf(
          "could not start the %d tokenizer threads of --workers %d (%s): pass fewer --workers", o.workers + 1,
          o.workers, e.what()))));
    }
  };
  for (int w = 0; w < o.workers; ++w) {
    start_thread([&] {
      try {
        while (auto item = pipeline.take()) {
          encode_batch(item->second, o, *tokenizer);
          pipeline.finish(item->first, std::move(item->second));
        }
      } catch (...) {
        pipeline.fail(std::current_exception());
      }
    });
  }
  start_thread([&] {
    int64_t batches = 0;
    try {
      batches = read_input(in, pipeline);
    } catch (...) {
      pipeline.fail(std::current_exception());
    }
    pipeline.close_input(batches);
  });

  try {
    write_in_order(pipeline, builders, o.log_interval, log, stats);
  } catch (...) {
    pipeline.fail(std::current_exception());
  }
  for (auto& t : threads) t.join();
  if (auto error = pipeline.error()) std::rethrow_exception(error);
  // An empty dataset would only fail later, inside training, far from its cause.
  if (stats.documents == 0)
    throw UserError(strprintf("--input %s holds no documents (one JSON object per line expected); nothing written",
                              o.input.c_str()));

  for (size_t k = 0; k < builders.size(); ++k) builders[k]->finalize(outputs.idx(k));
  builders.clear();
  outputs.commit();
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace fp8tron::data
