// TensorBoard scalar logging without torch or protobuf, for Megatron's --tensorboard-dir.
// An event file is a sequence of TFRecords, each holding one serialized tensorflow.Event; we write
// the few protobuf fields TensorBoard needs for scalars by hand, and read them back for tests/tools.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace fp8tron {

class TensorBoardWriter {
 public:
  // Creates log_dir (recursively) if needed and opens
  // log_dir/events.out.tfevents.<unix seconds>.<hostname>.<pid>, writing the file_version record.
  // Throws UserError naming the directory if it cannot be created or the file cannot be opened.
  explicit TensorBoardWriter(const std::string& log_dir);
  ~TensorBoardWriter();  // flushes
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event with a single Summary.Value{tag, simple_value}. TensorBoard stores simple_value as a
  // float, so the value is narrowed here.
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

struct ScalarEvent {
  std::string tag;
  double value;
  int64_t step;
  double wall_time;
};

// Reads an event file back: checks every record's length and data CRCs, decodes the Events and
// returns their simple_value summary values in file order. Throws UserError naming the file on a
// corrupt or truncated record.
std::vector<ScalarEvent> read_tensorboard_scalars(const std::string& path);

// CRC-32C (Castagnoli), and the rotated+offset form TFRecord stores (so that a CRC over data that
// itself contains CRCs does not degenerate).
uint32_t crc32c(std::string_view bytes);
uint32_t masked_crc32c(std::string_view bytes);

}  // namespace fp8tron
