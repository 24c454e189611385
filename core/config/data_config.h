// Where the tokens come from: built-in, mock or Megatron indexed datasets, and the tokenizer.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fp8tron {

enum class DataSource { Builtin, Mock, Files };
// --dataloader-type: single = consecutive samples (MegatronPretrainingSampler); cyclic = a fresh
// permutation every epoch, cycled forever (MegatronPretrainingRandomSampler).
enum class DataloaderType { Single, Cyclic };

// --fim-data and its flags: Megatron's fill-in-the-middle dataset (GPTFIMDataset), which rewrites
// a share of the samples as prefix/suffix/middle (PSM) or suffix/prefix/middle (SPM) text
// (data/fim_dataset.h). Megatron's defaults.
struct FimConfig {
  bool enabled = false;                   // --fim-data
  double rate = 0.5;                      // --fim-rate: share of segments (or samples) rewritten
  double spm_rate = 0.5;                  // --fim-spm-rate: share of rewritten ones in SPM order
  std::optional<std::string> split_sample;  // --fim-split-sample: token splitting a sample into fragments
  std::optional<double> fragment_rate;    // --fim-fragment-rate: share of fragments rewritten
  std::optional<std::string> no_prefix;   // --fim-no-prefix: text whose segments are left alone
  std::string prefix_token = "<fim_prefix>", middle_token = "<fim_middle>", suffix_token = "<fim_suffix>",
              pad_token = "<fim_pad>", eod_token = "<|endoftext|>";  // --fim-*-token
};

struct DataConfig {
  DataSource source = DataSource::Builtin;
  std::vector<std::string> data_path;  // [weight] prefix ... (--data-path)
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string split = "969, 30, 1";
  std::string data_cache_path;
  std::string tokenizer_type, vocab_file, merge_file, tokenizer_model;
  bool tokenizer_defaulted = false;        // no --tokenizer-type: pretrain_gpt.py's GPT2BPETokenizer
  std::optional<int64_t> null_vocab_size;  // --vocab-size (NullTokenizer, TikTokenizer)
  std::optional<int64_t> null_eod_id;      // --null-tokenizer-eod-id
  std::string tiktoken_pattern;            // --tiktoken-pattern ("" = v2)
  int64_t tiktoken_num_special_tokens = 1000;
  std::vector<std::string> special_tokens;  // --tokenizer-special-tokens
  int64_t eod = -1;                        // the tokenizer's end-of-document id (-1: none)
  // The tokenizer's pad id: Megatron's GPT dataset masks labels equal to it out of the loss
  // (and feeds id 0 instead); -1: none (also when it collides with the eod id, as in Megatron).
  int64_t pad = -1;
  bool eod_mask_loss = false, reset_position_ids = false, reset_attention_mask = false;
  int num_workers = 2;                     // batches prepared ahead by the loader thread
  // --no-create-attention-mask-in-dataloader: no per-document attention mask (attention stays
  // causal; --reset-attention-mask then changes nothing but the position ids it implies).
  bool create_attention_mask = true;
  bool mmap_bin_files = true;              // --no-mmap-bin-files: read .bin files with pread
  DataloaderType dataloader_type = DataloaderType::Single;
  bool data_sharding = true;               // --no-data-sharding (cyclic loader)
  FimConfig fim;
};

}  // namespace fp8tron
