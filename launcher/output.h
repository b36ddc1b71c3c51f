// The launcher's messages, written so that writing can never stop it: with write(2), each
// failure ignored. When the reader of its output has gone (`dscpp ... | head`), a write fails
// with EPIPE; fmt::print would throw there, and an exception in the supervisor skips the
// teardown of the ranks. No message is worth that. SIGPIPE is ignored for the same reason
// (ignore_sigpipe, at the start of main).
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

namespace dscpp::launcher {

// Writes all of `text` to `fd`, retrying on EINTR; any other failure drops the rest.
void write_quietly(int fd, const std::string& text);

// fmt::format to stderr (say) or stdout (say_out), through write_quietly.
template <typename... Args>
void say(fmt::format_string<Args...> format, Args&&... args) {
  write_quietly(2, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void say_out(fmt::format_string<Args...> format, Args&&... args) {
  write_quietly(1, fmt::format(format, std::forward<Args>(args)...));
}

// Sets SIGPIPE to be ignored in this process, so that a write to a closed pipe is an EPIPE
// error and not the launcher's death. The ranks get SIGPIPE's default action back
// (Supervisor's fork_exec), as Python's subprocess gives it to DeepSpeed's ranks.
void ignore_sigpipe();

}  // namespace dscpp::launcher
