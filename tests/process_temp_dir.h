// A temporary folder that belongs to this test process alone. ctest runs every case as a process
// of its own, several at a time, and several checkouts may run their suites on one machine at
// once: under fixed names in the shared temporary folder one case can rewrite a file that another
// is reading or has mapped (a wrong result, or SIGBUS). Files go here instead; the folder is
// removed when the process exits. Test layer (header-only, any test program).
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace sciattn::testing {

class ProcessTempDir {
 public:
  ProcessTempDir()
      : path_(::testing::TempDir() + "sciattn_test_" + std::to_string(::getpid()) + "/") {
    std::error_code ec;
    std::filesystem::create_directories(path_, ec);
  }
  ~ProcessTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ProcessTempDir(const ProcessTempDir&) = delete;
  ProcessTempDir& operator=(const ProcessTempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The folder's path, ending in '/'.
inline const std::string& process_temp_dir() {
  static const ProcessTempDir dir;
  return dir.path();
}

}  // namespace sciattn::testing
