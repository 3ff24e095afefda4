#pragma once
// Helpers shared by the tests: where the shared fixtures are, and reading them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tandem::test {

// ../shared/fixtures relative to the repository root, or $TANDEM_FIXTURES_DIR (test binaries
// that run elsewhere, as tools/gpu-check.sh's). A missing folder fails the test with a message
// that says where it was looked for, rather than skipping silently.
inline std::filesystem::path fixtures_dir() {
  const char* moved = std::getenv("TANDEM_FIXTURES_DIR");
  const std::filesystem::path dir = moved && *moved ? moved : TANDEM_FIXTURES_DIR;
  if (!std::filesystem::is_directory(dir))
    ADD_FAILURE() << "shared fixtures not found at " << dir
                  << ": tests expect ../shared/fixtures beside the repository root";
  return dir;
}

inline std::filesystem::path fixture(const std::string& name) { return fixtures_dir() / name; }

inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ADD_FAILURE() << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace tandem::test
