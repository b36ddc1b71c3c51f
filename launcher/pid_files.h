// DeepSpeed's --save_pid files: <dir>/<owner>.deepspeed holds the launcher's pid and
// <dir>/<owner>.deepspeed.ranks the rank pids, one a line (dir is /tmp). The launcher removes
// them when it exits; one killed with SIGKILL cannot, so every launch first removes the files
// whose launcher is gone (remove_stale_pid_files).
#pragma once

#include <string>
#include <vector>

namespace dscpp::launcher {

inline constexpr const char* kPidFileDir = "/tmp";

// "<dir>/<owner>.deepspeed".
std::string pid_file_path(const std::string& dir, int owner);

// Written under `path`.tmp and renamed, so a reader never sees half a file; a failure is a
// warning (the job runs without the file), and leaves no .tmp behind.
void write_file_atomically(const std::string& path, const std::string& text);

// Removes from `dir`, among regular files owned by this user only:
//  - <N>.deepspeed whose launcher (the pid written in it, which is not N on the other hosts
//    of a multi-node job) is not a live process, with its <N>.deepspeed.ranks;
//  - <N>.deepspeed.ranks without its <N>.deepspeed (its launcher removes that one first);
//  - <N>.deepspeed.tmp and <N>.deepspeed.ranks.tmp older than a minute (a launcher renames
//    its own within moments).
// A file that does not hold a pid is left alone. Returns the paths removed.
std::vector<std::string> remove_stale_pid_files(const std::string& dir);

}  // namespace dscpp::launcher
