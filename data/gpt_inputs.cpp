#include "data/gpt_inputs.h"

#include "data/sample_dataset.h"

namespace fp8tron::data {

void make_gpt_inputs(const int64_t* sample, int64_t seq_length, int64_t eod, const GptInputOptions& options,
                     int64_t* tokens, int64_t* labels, float* loss_mask, int64_t* position_ids, int32_t* segment_ids) {
  int64_t position = 0;
  int32_t segment = 0;
  for (int64_t i = 0; i < seq_length; ++i) {
    const int64_t token = sample[i], label = sample[i + 1];
    const auto is_pad = [&](int64_t id) { return id == kPadTokenId || (options.pad >= 0 && id == options.pad); };
    loss_mask[i] = (options.eod_mask_loss && token == eod) || is_pad(label) ? 0.0f : 1.0f;
    tokens[i] = is_pad(token) ? 0 : token;
    labels[i] = is_pad(label) ? 0 : label;
    position_ids[i] = options.reset_position_ids ? position : i;
    if (segment_ids) segment_ids[i] = options.reset_attention_mask ? segment : 0;
    // The eod token itself belongs to the document it ends; the next position starts a new one.
    ++position;
    if (token == eod) {
      position = 0;
      ++segment;
    }
  }
}

}  // namespace fp8tron::data
