#include "tools/serve/children.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace ds::serve {

Child Spawn(const std::string& role, const std::string& exe, const std::vector<std::string>& args) {
  Child c;
  c.role = role;
  std::vector<std::string> argv_s;
  argv_s.push_back(exe);
  argv_s.push_back(role);
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "deltaserve serve: fork for %s failed: %s\n", role.c_str(),
                 std::strerror(errno));
    return c;
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the launcher died before prctl took effect
    // The launcher blocks SIGINT/SIGTERM to sigwait on them; the role must see them again.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(exe.c_str(), argv.data());
    std::fprintf(stderr, "deltaserve serve: exec %s failed: %s\n", exe.c_str(),
                 std::strerror(errno));
    _exit(127);
  }
  c.pid = pid;
  return c;
}

bool Reap(Child* c) {
  if (c->pid <= 0 || c->exited) return true;
  int st = 0;
  const pid_t r = waitpid(c->pid, &st, WNOHANG);
  if (r == c->pid) {
    c->exited = true;
    c->wait_status = st;
  }
  return c->exited;
}

std::string DescribeExit(const Child& c) {
  std::ostringstream o;
  if (WIFEXITED(c.wait_status)) {
    o << "exited with status " << WEXITSTATUS(c.wait_status);
  } else if (WIFSIGNALED(c.wait_status)) {
    o << "killed by signal " << WTERMSIG(c.wait_status);
  } else {
    o << "ended (wait status " << c.wait_status << ")";
  }
  return o.str();
}

void Stop(Child* c, std::chrono::milliseconds grace) {
  if (c->pid <= 0 || Reap(c)) return;
  kill(c->pid, SIGTERM);
  const auto end = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < end) {
    if (Reap(c)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "deltaserve serve: %s (pid %d) did not stop in %lld ms; killing it\n",
               c->role.c_str(), c->pid, static_cast<long long>(grace.count()));
  kill(c->pid, SIGKILL);
  int st = 0;
  waitpid(c->pid, &st, 0);
  c->exited = true;
  c->wait_status = st;
}

std::string WaitForFile(const std::string& path, Child* child, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream in(path);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      if (!ss.str().empty()) return ss.str();
    }
    if (Reap(child)) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

}  // namespace ds::serve
