#include "system.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "cli.hpp"

namespace flashgrad::tools {

namespace {

// Runs between fork and exec, so it only makes system calls.
[[noreturn]] void exec_child(char* const* argv, int out_fd, bool discard_stderr) {
  dup2(out_fd, STDOUT_FILENO);
  close(out_fd);
  if (discard_stderr) {
    const int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0) dup2(null_fd, STDERR_FILENO);
  }
  execv(argv[0], argv);
  static const char msg[] = "flashgrad: cannot run a child process\n";
  (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
  _exit(127);
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      return out;
    }
  }
}

}  // namespace

ChildResult run_child(const std::vector<std::string>& argv, bool discard_stderr) {
  std::vector<char*> raw;
  for (const auto& a : argv) raw.push_back(const_cast<char*>(a.c_str()));
  raw.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(std::string("flashgrad: pipe: ") + std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  const double t0 = now_seconds();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("flashgrad: fork: ") + std::strerror(errno));
  if (pid == 0) {
    close(fds[0]);
    exec_child(raw.data(), fds[1], discard_stderr);
  }
  close(fds[1]);
  ChildResult r;
  r.output = read_all(fds[0]);
  close(fds[0]);
  int status = 0;
  struct rusage ru {};
  while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.seconds = now_seconds() - t0;
  r.peak_rss_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

std::string how_it_ended(const ChildResult& r) {
  if (r.signal == SIGKILL) return "was killed by signal 9 (out of memory?)";
  if (r.signal) return "was killed by signal " + std::to_string(r.signal);
  return "exited with status " + std::to_string(r.exit_code);
}

std::string self_executable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("flashgrad: cannot read /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (in >> key >> value >> unit)
    if (key == "MemAvailable:") return value * 1024;
  return -1;
}

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

ProgressBar::ProgressBar(int64_t total)
    : total_(total), enabled_(stdout_is_terminal() && total > 0), start_(now_seconds()) {}

void ProgressBar::update(int64_t done, const std::string& label) {
  if (!enabled_) return;
  constexpr int64_t width = 30;
  const int64_t filled = total_ > 0 ? width * done / total_ : 0;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(static_cast<size_t>(width), '.');
  std::printf("\r\033[K[%s] %lld/%lld %5.1fs %s", bar.c_str(), static_cast<long long>(done),
              static_cast<long long>(total_), now_seconds() - start_, label.substr(0, 40).c_str());
  std::fflush(stdout);
  shown_ = true;
}

void ProgressBar::clear() {
  if (!shown_) return;
  std::printf("\r\033[K");
  std::fflush(stdout);
  shown_ = false;
}

}  // namespace flashgrad::tools
