// Datasets that need no files: Megatron's --mock-data and fp8tron's --builtin-data (a learnable
// synthetic text). Both are pure functions of (split, global sample index): the same index gives
// the same tokens whatever the parallel layout, as Megatron's GPT dataset does.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "data/loader/sample_source.h"

namespace fp8tron {

// Megatron's mock dataset (MockGPTDataset): its documents (data/mock_dataset.h) sampled by the GPT
// dataset with the split 1,1,1 and --seed, so the samples are the ones Megatron trains on.
// `samples`: what each split must supply (Megatron's train/valid/test sizes); nullopt: one epoch.
std::unique_ptr<SampleSource> make_mock_source(int64_t seq_length, int64_t vocab_size, int64_t eod, uint64_t seed,
                                               const std::array<std::optional<int64_t>, 3>& samples = {});

// First-order Markov text over min(vocab, 1024) "active" tokens: each token has four possible
// successors with probabilities 0.55/0.25/0.15/0.05 (entropy 1.11 nats), so a small GPT's loss
// falls far below ln(vocab) within a few hundred steps.
std::unique_ptr<SampleSource> make_builtin_source(int64_t seq_length, int64_t vocab_size, uint64_t seed);

// Entropy rate of the built-in text in nats per token: the loss a perfect model reaches.
double builtin_source_entropy();

}  // namespace fp8tron
