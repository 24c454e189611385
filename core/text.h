// Small string helpers shared by torch and torch-free code (torch translation units cannot use
// fmt: LibTorch ships its own copy of its headers).
#pragma once
#include <cstdarg>
#include <cstdint>
#include <string>
#include <vector>

namespace fp8tron {

// printf-style formatting into a std::string.
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, or "" when nothing is reasonably close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& parts, const std::string& sep);

// A tensor's shape as "[4096, 1024]".
std::string shape_text(const std::vector<int64_t>& shape);

// "1.32 B", "124.4 M": human-readable counts; "3.25 GiB": byte sizes.
std::string human_count(double n);
std::string human_bytes(double bytes);

}  // namespace fp8tron
