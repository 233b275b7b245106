// Child processes of `deltaserve serve`: fork + exec of /proc/self/exe with a role's arguments.
// Children get their own process group (a terminal ^C reaches only the launcher, which stops them
// in order) and PR_SET_PDEATHSIG(SIGTERM), so they never outlive a launcher that crashed.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace ds::serve {

struct Child {
  std::string role;
  pid_t pid = -1;
  bool exited = false;
  int wait_status = 0;
};

// Starts `exe args...`; pid -1 on failure (errno logged).
Child Spawn(const std::string& role, const std::string& exe, const std::vector<std::string>& args);

// Reaps without blocking; true when the child has exited (now or earlier).
bool Reap(Child* c);
// "exited with status N" / "killed by signal N".
std::string DescribeExit(const Child& c);
// SIGTERM, wait up to `grace`, then SIGKILL and wait.
void Stop(Child* c, std::chrono::milliseconds grace);

// Waits for a file written by a child (port files are renamed into place, so never partial).
// Empty string on timeout or when `child` exits first.
std::string WaitForFile(const std::string& path, Child* child, std::chrono::milliseconds timeout);

}  // namespace ds::serve
