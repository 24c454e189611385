// From one sample (seq_length + 1 tokens) to the model's inputs, as Megatron's GPTDataset
// __getitem__ and _get_ltor_masks_and_position_ids make them: tokens = sample[:-1],
// labels = sample[1:], loss mask, position ids, and the document segment of each position (the
// attention mask with --reset-attention-mask is "k <= j and segment[k] == segment[j]").
#pragma once
#include <cstdint>

namespace fp8tron::data {

struct GptInputOptions {
  bool eod_mask_loss = false;         // --eod-mask-loss: no loss where the input token is eod
  bool reset_position_ids = false;    // --reset-position-ids: positions restart after each eod
  bool reset_attention_mask = false;  // --reset-attention-mask: no attention across an eod
  int64_t pad = -1;                   // the tokenizer's pad id: masked out like padding (-1: none)
};

// All outputs have seq_length entries. Padding (kPadTokenId, past the end of the data) and the
// tokenizer's pad id are masked out of the loss and replaced by id 0, as Megatron does. segment_ids may be null; it counts the
// eod tokens before each position when reset_attention_mask is set, else is all zero.
void make_gpt_inputs(const int64_t* sample, int64_t seq_length, int64_t eod, const GptInputOptions& options,
                     int64_t* tokens, int64_t* labels, float* loss_mask, int64_t* position_ids, int32_t* segment_ids);

}  // namespace fp8tron::data
