// Pieces shared by the command line programs (`flashgrad`, `flashgrad-baseline`
// and `flashgrad-lab`): the command loop, flag parsing, timing, number
// formatting and a small JSON writer.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace flashgrad::tools {

// A mistake on the command line; main() prints it with the command's usage.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The flags of one subcommand: "--name value", "--name=value" or a bare
// "--name" switch. Getters consume what they read; finish() rejects the rest,
// so a misspelt flag is an error rather than silently ignored.
class Args {
 public:
  Args(std::string program, std::string command, std::vector<std::string> tokens);

  const std::string& program() const { return program_; }
  const std::string& command() const { return command_; }
  std::string prefix() const { return program_ + " " + command_; }  // "flashgrad bench", for messages
  const std::vector<std::string>& tokens() const { return tokens_; }
  bool wants_help() const;
  bool has(const std::string& name);
  std::optional<std::string> value(const std::string& name);
  int64_t integer(const std::string& name, int64_t fallback, int64_t min,
                  int64_t max = std::numeric_limits<int64_t>::max());
  double real(const std::string& name, double fallback, double min);
  std::string choice(const std::string& name, const std::string& fallback,
                     const std::vector<std::string>& allowed);
  // "--name A,B" as two integers, each >= min.
  std::optional<std::pair<int64_t, int64_t>> integer_pair(const std::string& name, int64_t min);
  void finish() const;

  // "<program> <command>: flag <name>: expected <expected>, got '<got>'"
  [[noreturn]] void fail(const std::string& name, const std::string& expected, const std::string& got) const;

 private:
  std::optional<size_t> find(const std::string& name) const;

  std::string program_;
  std::string command_;
  std::vector<std::string> tokens_;
  std::vector<bool> used_;
};

int64_t parse_int64(const std::string& text, bool* ok);

// Wall-clock seconds of each of `repeats` calls of fn, after `warmup` calls.
std::vector<double> time_calls(const std::function<void()>& fn, int64_t warmup, int64_t repeats);
double median(std::vector<double> xs);
double now_seconds();

// printf-style formatting into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
double mib(int64_t bytes);

// Builds one JSON object; values are inserted in order, nested objects as
// their finished text.
class Json {
 public:
  Json& add(const std::string& key, const std::string& text);
  Json& add(const std::string& key, const char* text);
  Json& add(const std::string& key, double number);
  Json& add(const std::string& key, int64_t number);
  Json& add(const std::string& key, int number) { return add(key, static_cast<int64_t>(number)); }
  Json& add(const std::string& key, bool flag);
  Json& add_null(const std::string& key);
  Json& add_raw(const std::string& key, const std::string& json);
  std::string str() const { return "{" + body_ + "}"; }

  static std::string quote(const std::string& text);
  static std::string array(const std::vector<std::string>& json_items);

 private:
  Json& field(const std::string& key, const std::string& json);
  std::string body_;
};

// A program of subcommands: `<name> <command> [flags]`.
struct Program {
  const char* name;      // "flashgrad"
  const char* overview;  // printed for --help, and with no command
  std::map<std::string, std::string> usage;  // per command, for `<command> --help` and usage errors
  std::function<int(const std::string& command, Args& args)> dispatch;  // throws UsageError if unknown
};

// Runs argv's command: usage errors exit 2 with the command's usage, other
// errors exit 1 with their message.
int run_program(const Program& program, int argc, char** argv);

std::string version();

}  // namespace flashgrad::tools
