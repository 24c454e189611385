// Helpers shared by the data tests: a scratch directory per test and file writing.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace fp8tron::data::testing {

// A fresh directory under the system temp dir, removed at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("fp8tron_data_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Expects `statement` to throw a UserError whose message contains every one of `parts`.
#define EXPECT_USER_ERROR(statement, ...)                                              \
  do {                                                                                 \
    try {                                                                              \
      statement;                                                                       \
      ADD_FAILURE() << "expected a UserError from " #statement;                        \
    } catch (const ::fp8tron::UserError& e) {                                          \
      for (const std::string& part : std::vector<std::string>{__VA_ARGS__})            \
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)                 \
            << "message \"" << e.what() << "\" lacks \"" << part << "\"";             \
    }                                                                                  \
  } while (0)

}  // namespace fp8tron::data::testing
