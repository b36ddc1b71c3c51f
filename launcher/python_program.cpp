// runs_with_python, python_interpreter, program_prefix: the .py rule.
#include "python_program.h"

namespace dscpp::launcher {

bool runs_with_python(const std::string& program, bool no_python) {
  const std::string suffix = ".py";
  return !no_python && program.size() > suffix.size() &&
         program.compare(program.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string python_interpreter(const EnvList& env) {
  const auto python = get_env(env, "DSCPP_PYTHON");
  return python && !python->empty() ? *python : "python3";
}

std::vector<std::string> program_prefix(const std::string& program, bool no_python,
                                        const std::string& python) {
  // -u as DeepSpeed's launch.py: unbuffered, so a rank's lines reach the log as it prints them.
  if (runs_with_python(program, no_python)) return {python, "-u", program};
  return {program};
}

}  // namespace dscpp::launcher
