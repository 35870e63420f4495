#include "cli.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "flashgrad/flashgrad.hpp"

namespace flashgrad::tools {

std::string version() { return flashgrad::version(); }

int run_program(const Program& program, int argc, char** argv) {
  const std::string first = argc < 2 ? "" : argv[1];
  if (argc < 2 || first == "-h" || first == "--help" || first == "help") {
    std::fputs(program.overview, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  Args args(program.name, first, std::vector<std::string>(argv + 2, argv + argc));
  const auto usage = program.usage.find(first);
  if (usage != program.usage.end() && args.wants_help()) {
    std::fputs(usage->second.c_str(), stdout);
    return 0;
  }
  try {
    return program.dispatch(first, args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s\n\n%s", e.what(), usage != program.usage.end() ? usage->second.c_str() : program.overview);
    return 2;
  } catch (const flashgrad::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // the library's messages name their function
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", args.prefix().c_str(), e.what());
    return 1;
  }
}

Args::Args(std::string program, std::string command, std::vector<std::string> tokens)
    : program_(std::move(program)),
      command_(std::move(command)),
      tokens_(std::move(tokens)),
      used_(tokens_.size(), false) {}

bool Args::wants_help() const {
  return std::any_of(tokens_.begin(), tokens_.end(),
                     [](const std::string& t) { return t == "-h" || t == "--help"; });
}

std::optional<size_t> Args::find(const std::string& name) const {
  std::optional<size_t> found;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& t = tokens_[i];
    if (t != name && t.rfind(name + "=", 0) != 0) continue;
    if (found) throw UsageError(prefix() + ": flag " + name + " is given twice");
    found = i;
  }
  return found;
}

void Args::fail(const std::string& name, const std::string& expected, const std::string& got) const {
  throw UsageError(prefix() + ": flag " + name + ": expected " + expected + ", got '" + got + "'");
}

bool Args::has(const std::string& name) {
  const auto i = find(name);
  if (!i) return false;
  if (tokens_[*i] != name) fail(name, "no value (it is a switch)", tokens_[*i]);
  used_[*i] = true;
  return true;
}

std::optional<std::string> Args::value(const std::string& name) {
  const auto i = find(name);
  if (!i) return std::nullopt;
  used_[*i] = true;
  const std::string& t = tokens_[*i];
  if (t.size() > name.size()) return t.substr(name.size() + 1);
  if (*i + 1 >= tokens_.size()) fail(name, "a value after it", "the end of the command line");
  used_[*i + 1] = true;
  return tokens_[*i + 1];
}

int64_t parse_int64(const std::string& text, bool* ok) {
  int64_t x = 0;
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, x);
  *ok = !text.empty() && r.ec == std::errc() && r.ptr == end;
  return x;
}

int64_t Args::integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) {
  const auto text = value(name);
  if (!text) return fallback;
  bool ok = false;
  const int64_t x = parse_int64(*text, &ok);
  if (!ok || x < min || x > max) {
    std::string range = "an integer >= " + std::to_string(min);
    if (max != std::numeric_limits<int64_t>::max()) range += " and <= " + std::to_string(max);
    fail(name, range, *text);
  }
  return x;
}

double Args::real(const std::string& name, double fallback, double min) {
  const auto text = value(name);
  if (!text) return fallback;
  char* end = nullptr;
  const double x = std::strtod(text->c_str(), &end);
  if (text->empty() || *end != '\0' || !std::isfinite(x) || x < min)
    fail(name, "a number >= " + format("%g", min), *text);
  return x;
}

std::string Args::choice(const std::string& name, const std::string& fallback,
                         const std::vector<std::string>& allowed) {
  const auto text = value(name);
  if (!text) return fallback;
  if (std::find(allowed.begin(), allowed.end(), *text) != allowed.end()) return *text;
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i)
    list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
  fail(name, "one of " + list, *text);
}

std::optional<std::pair<int64_t, int64_t>> Args::integer_pair(const std::string& name, int64_t min) {
  const auto text = value(name);
  if (!text) return std::nullopt;
  const size_t comma = text->find(',');
  bool ok_a = false, ok_b = false;
  int64_t a = 0, b = 0;
  if (comma != std::string::npos) {
    a = parse_int64(text->substr(0, comma), &ok_a);
    b = parse_int64(text->substr(comma + 1), &ok_b);
  }
  if (!ok_a || !ok_b || a < min || b < min)
    fail(name, "two integers >= " + std::to_string(min) + " as LEFT,RIGHT", *text);
  return std::make_pair(a, b);
}

void Args::finish() const {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (used_[i]) continue;
    const std::string& t = tokens_[i];
    if (t.rfind("--", 0) == 0) throw UsageError(prefix() + ": unknown flag '" + t + "'");
    throw UsageError(prefix() + ": unexpected argument '" + t + "'");
  }
}

double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

std::vector<double> time_calls(const std::function<void()>& fn, int64_t warmup, int64_t repeats) {
  for (int64_t i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  for (int64_t i = 0; i < repeats; ++i) {
    const double t0 = now_seconds();
    fn();
    times.push_back(now_seconds() - t0);
  }
  return times;
}

double median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  std::string out;
  if (n < static_cast<int>(sizeof small)) {
    out = small;
  } else {
    out.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data(), out.size(), fmt, ap2);
    out.resize(static_cast<size_t>(n));
  }
  va_end(ap2);
  return out;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

Json& Json::field(const std::string& key, const std::string& json) {
  body_ += (body_.empty() ? "" : ", ") + quote(key) + ": " + json;
  return *this;
}

Json& Json::add(const std::string& key, const std::string& text) { return field(key, quote(text)); }
Json& Json::add(const std::string& key, const char* text) { return field(key, quote(text)); }
Json& Json::add(const std::string& key, int64_t number) { return field(key, std::to_string(number)); }
Json& Json::add(const std::string& key, bool flag) { return field(key, flag ? "true" : "false"); }
Json& Json::add_null(const std::string& key) { return field(key, "null"); }
Json& Json::add_raw(const std::string& key, const std::string& json) { return field(key, json); }

Json& Json::add(const std::string& key, double number) {
  // JSON has no NaN or Inf.
  return field(key, std::isfinite(number) ? format("%.6g", number) : "null");
}

std::string Json::quote(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += format("\\u%04x", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string Json::array(const std::vector<std::string>& json_items) {
  std::string out = "[";
  for (size_t i = 0; i < json_items.size(); ++i) out += (i ? ", " : "") + json_items[i];
  return out + "]";
}

}  // namespace flashgrad::tools
