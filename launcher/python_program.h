// The .py rule of DeepSpeed's launcher (launch.py, and the MPI runners' python_exec): a program
// whose name ends in ".py" runs as `<interpreter> -u <program> <args>`, unless --no_python says
// to run it directly. The interpreter is $DSCPP_PYTHON, else python3 from PATH (DeepSpeed uses
// its own sys.executable; a native launcher has none, so the user may name one).
#pragma once

#include <string>
#include <vector>

#include "environment.h"

namespace dscpp::launcher {

// True when `program` is to run under the interpreter.
bool runs_with_python(const std::string& program, bool no_python);

// $DSCPP_PYTHON from `env` when set and non-empty, else "python3".
std::string python_interpreter(const EnvList& env);

// What the rank runs before its own arguments: {python, "-u", program} or {program}.
std::vector<std::string> program_prefix(const std::string& program, bool no_python,
                                        const std::string& python);

}  // namespace dscpp::launcher
