// --moe-layer-freq: which transformer layers are mixture-of-experts layers. Megatron accepts an
// int N (layer i is MoE iff i % N == 0) or a Python list expression over the characters
// 0-9 , [ ] ( ) + * that it eval()s, e.g. "([0]*1+[1]*3)*2" -> [0,1,1,1,0,1,1,1]. fp8tron
// evaluates that expression language itself (ints, lists, +, *, **, unary +, parentheses, with
// Python's precedence and types) instead of running an interpreter.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fp8tron {

// The per-layer pattern (true = MoE layer) of `value` for a model of `num_layers` layers.
// Throws UserError naming --moe-layer-freq for a malformed expression, a result that is not a
// flat list of 0/1, a list whose length is not --num-layers, or an int below 1.
std::vector<bool> parse_moe_layer_freq(const std::string& value, int64_t num_layers);

}  // namespace fp8tron
