// One dataset per split (data/'s GPT datasets, blends of them) as a SampleSource: what both the
// indexed files (file_source.h) and Megatron's mock data (builtin_datasets.h) are sampled through.
#pragma once
#include <memory>

#include "data/dataset_builder.h"
#include "data/loader/sample_source.h"

namespace fp8tron {

// `datasets[i]` may be null (an empty split). Asking a split for more samples than it has is a
// UserError naming the split and both counts.
std::unique_ptr<SampleSource> make_split_datasets_source(data::SplitDatasets datasets);

}  // namespace fp8tron
