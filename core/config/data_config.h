// Where the tokens come from: built-in, mock or Megatron indexed datasets, and the tokenizer.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fp8tron {

enum class DataSource { Builtin, Mock, Files };

struct DataConfig {
  DataSource source = DataSource::Builtin;
  std::vector<std::string> data_path;  // [weight] prefix ... (--data-path)
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "969, 30, 1";
  std::string data_cache_path;
  std::string tokenizer_type, vocab_file, merge_file, tokenizer_model;
  std::optional<int64_t> null_vocab_size;  // --vocab-size for the NullTokenizer
  int64_t eod = -1;                        // the tokenizer's end-of-document id (-1: none)
  bool eod_mask_loss = false, reset_position_ids = false, reset_attention_mask = false;
  int num_workers = 2;                     // batches prepared ahead by the loader thread
};

}  // namespace fp8tron
