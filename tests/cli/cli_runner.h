#pragma once
// Runs the `tandem` binary built with the tests and captures what it prints.
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace tandem {

struct CliResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// One shell word holding `text` exactly.
inline std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

inline CliResult run_tandem(const std::string& args, const std::string& stdin_text = "") {
  std::string command = std::string(TANDEM_BINARY) + " " + args + " 2>&1";
  if (!stdin_text.empty()) command = "printf '%s' '" + stdin_text + "' | " + command;
  else command += " </dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  CliResult result{-1, ""};
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace tandem
