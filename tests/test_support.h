#pragma once
// Helpers shared by the tests: where the shared fixtures are, and reading them.
#include <gtest/gtest.h>
#include <unistd.h>

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

// XDG_CACHE_HOME pointed at a fresh folder while it lives (what tandem caches there, measured
// rates, goes there; a `tandem` the test starts inherits it), restored and removed after.
class ScopedCacheDir {
 public:
  explicit ScopedCacheDir(const std::string& name)
      : dir_(std::filesystem::temp_directory_path() /
             ("tandem-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir_);
    if (const char* old = std::getenv("XDG_CACHE_HOME")) had_ = true, saved_ = old;
    ::setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
  }
  ~ScopedCacheDir() {
    if (had_)
      ::setenv("XDG_CACHE_HOME", saved_.c_str(), 1);
    else
      ::unsetenv("XDG_CACHE_HOME");
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  ScopedCacheDir(const ScopedCacheDir&) = delete;
  ScopedCacheDir& operator=(const ScopedCacheDir&) = delete;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::string saved_;
  bool had_ = false;
};

}  // namespace tandem::test
