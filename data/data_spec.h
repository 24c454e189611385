// Parsing of the flags that say which data to train on, with Megatron's semantics:
//   --split "969,30,1"          -> train/valid/test fractions -> contiguous document ranges
//   --data-path [w1] p1 [w2] p2 -> a blend: dataset prefixes with optional weights
// Arithmetic follows Megatron's Python (numpy float64 sums, Python round-half-even) so the same
// flags select the same documents.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fp8tron::data {

enum class Split { Train = 0, Valid = 1, Test = 2 };
constexpr int kNumSplits = 3;
const char* split_name(Split split);  // "train", "valid", "test" (Megatron's Split enum names)

// numpy.sum over float64 (pairwise summation), so normalized weights match Megatron bit for bit.
double numpy_sum(const std::vector<double>& values);
// Megatron's utils.normalize: w / sum(w).
std::vector<double> normalize(const std::vector<double>& weights);

// parse_and_normalize_split: the numbers in `split`, padded with zeros to three, normalized.
std::vector<double> parse_split(const std::string& split);

// A split's [begin, end) fraction of the dataset, or nullopt when the split is empty.
using SplitRange = std::optional<std::pair<double, double>>;
std::array<SplitRange, kNumSplits> split_matrix(const std::vector<double>& fractions);

// The [begin, end) sequence indices a fraction range selects from `num_sequences`
// (int(round(f * n)) with round-half-even, as Megatron).
std::pair<int64_t, int64_t> sequence_range(const std::pair<double, double>& range, int64_t num_sequences);

struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;  // as given, not normalized
};

// get_blend_from_list: an even-length list whose even entries all parse as numbers is
// weight/prefix pairs; any other list is prefixes only.
Blend parse_blend(const std::vector<std::string>& args);

// _get_size_per_split_per_dataset for one split: ceil(ceil(size * w) * (1 + surplus)) per
// normalized weight w.
std::vector<int64_t> samples_per_dataset(const std::vector<double>& normalized_weights, int64_t size,
                                         double surplus);

}  // namespace fp8tron::data
