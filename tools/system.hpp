// What the CLI needs from the operating system: child processes with their
// peak memory, the memory available, the terminal, a progress bar.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashgrad::tools {

struct ChildResult {
  int exit_code = -1;          // -1 when the child did not exit normally
  int signal = 0;              // the signal that ended it, if any
  std::string output;          // its stdout
  int64_t peak_rss_bytes = 0;  // its own high-water resident set (ru_maxrss)
  double seconds = 0;          // wall time from fork to exit
};

// Runs argv[0] (a path, not searched in PATH) with the given arguments,
// stdout captured and stderr inherited (or discarded), and waits for it.
ChildResult run_child(const std::vector<std::string>& argv, bool discard_stderr = false);

// "exited with status 3", "was killed by signal 9 (out of memory?)".
std::string how_it_ended(const ChildResult& r);

// The absolute path of this executable.
std::string self_executable();

// MemAvailable from /proc/meminfo in bytes, or -1 if it cannot be read.
int64_t mem_available_bytes();

bool stdout_is_terminal();

// A one-line bar redrawn in place with '\r' on stdout; a no-op unless stdout
// is a terminal. Call clear() before printing anything else.
class ProgressBar {
 public:
  explicit ProgressBar(int64_t total);
  ~ProgressBar() { clear(); }
  void update(int64_t done, const std::string& label);
  void clear();

 private:
  int64_t total_;
  bool enabled_;
  bool shown_ = false;
  double start_;
};

}  // namespace flashgrad::tools
