#include "rank_launcher.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace gpumem::zero::testing {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A port nobody listens on right now (rank 0 binds it moments later).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error(fmt::format("could not find a free port: {}", std::strerror(errno)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string substitute(std::string arg, const std::string& dir) {
  const std::string key = "{dir}";
  for (std::size_t at = arg.find(key); at != std::string::npos; at = arg.find(key))
    arg.replace(at, key.size(), dir);
  return arg;
}

}  // namespace

std::string LaunchResult::describe() const {
  std::string out = fmt::format("{} rank(s), {:.1f} s{}:", ranks.size(), seconds,
                                deadline_hit ? ", DEADLINE HIT (killed)" : "");
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const RankExit& e = ranks[r];
    std::string tail = e.err.size() > 1500 ? "..." + e.err.substr(e.err.size() - 1500) : e.err;
    out += fmt::format("\n-- rank {}: {} after {:.1f} s; stderr:\n{}", r,
                       e.signal != 0 ? fmt::format("signal {}", e.signal)
                                     : fmt::format("exit code {}", e.exit_code),
                       e.seconds, tail);
  }
  return out;
}

LaunchResult launch(const LaunchSpec& spec) {
  if (spec.world_size < 1) throw std::invalid_argument("launch: world_size must be >= 1");
  char dir_template[] = "/tmp/gpumem-zero-launch-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) {
    throw std::runtime_error(fmt::format("mkdtemp: {}", std::strerror(errno)));
  }
  LaunchResult result;
  result.dir = dir_template;

  c10::intrusive_ptr<c10d::TCPStore> agent;
  int port = 0;
  if (spec.agent_store) {
    c10d::TCPStoreOptions opts;
    opts.port = 0;  // the kernel picks a free one
    opts.isServer = true;
    opts.waitWorkers = false;
    agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
    port = agent->getPort();
  } else {
    port = free_port();
  }

  // Everything the children need is built before fork: between fork and exec only
  // async-signal-safe calls (open, dup2, setpgid, execve, _exit).
  std::vector<std::string> args{spec.program};
  for (const std::string& a : spec.args) args.push_back(substitute(a, result.dir));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const std::string name = var.substr(0, var.find('='));
    if (name == "RANK" || name == "WORLD_SIZE" || name == "LOCAL_RANK" || name == "MASTER_ADDR" ||
        name == "MASTER_PORT" || name == "TORCHELASTIC_USE_AGENT_STORE" ||
        name == "OMP_NUM_THREADS") {
      continue;
    }
    inherited.push_back(var);
  }
  struct Child {
    std::vector<std::string> env;
    std::vector<char*> envp;
    std::string out_path, err_path;
    pid_t pid = -1;
    bool done = false;
  };
  std::vector<Child> children(static_cast<std::size_t>(spec.world_size));
  for (int r = 0; r < spec.world_size; ++r) {
    Child& c = children[static_cast<std::size_t>(r)];
    c.env = inherited;
    c.env.push_back(fmt::format("RANK={}", r));
    c.env.push_back(fmt::format("WORLD_SIZE={}", spec.world_size));
    c.env.push_back(fmt::format("LOCAL_RANK={}", r));
    c.env.push_back("MASTER_ADDR=127.0.0.1");
    c.env.push_back(fmt::format("MASTER_PORT={}", port));
    c.env.push_back("OMP_NUM_THREADS=1");
    if (spec.agent_store) c.env.push_back("TORCHELASTIC_USE_AGENT_STORE=True");
    for (std::string& v : c.env) c.envp.push_back(v.data());
    c.envp.push_back(nullptr);
    c.out_path = fmt::format("{}/rank{}.out", result.dir, r);
    c.err_path = fmt::format("{}/rank{}.err", result.dir, r);
  }

  const auto start = std::chrono::steady_clock::now();
  pid_t group = 0;
  for (int r = 0; r < spec.world_size; ++r) {
    Child& c = children[static_cast<std::size_t>(r)];
    const pid_t pid = ::fork();
    if (pid < 0) {
      if (group > 0) ::kill(-group, SIGKILL);
      throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
    }
    if (pid == 0) {
      ::setpgid(0, group);  // the first child leads the group, the others join it
      const int out = ::open(c.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(c.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0 || err < 0) ::_exit(126);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      ::execve(argv[0], argv.data(), c.envp.data());
      ::_exit(127);
    }
    if (group == 0) group = pid;
    ::setpgid(pid, group);  // also from here: no race with the child's own call
    c.pid = pid;
  }

  result.ranks.resize(static_cast<std::size_t>(spec.world_size));
  const auto deadline = start + spec.deadline;
  int running = spec.world_size;
  while (running > 0) {
    for (int r = 0; r < spec.world_size; ++r) {
      Child& c = children[static_cast<std::size_t>(r)];
      if (c.done) continue;
      int status = 0;
      const pid_t got = ::waitpid(c.pid, &status, WNOHANG);
      if (got != c.pid) continue;
      RankExit& e = result.ranks[static_cast<std::size_t>(r)];
      e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
      c.done = true;
      --running;
    }
    if (running == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      result.deadline_hit = true;
      ::kill(-group, SIGKILL);
      for (int r = 0; r < spec.world_size; ++r) {
        Child& c = children[static_cast<std::size_t>(r)];
        if (c.done) continue;
        int status = 0;
        ::waitpid(c.pid, &status, 0);
        RankExit& e = result.ranks[static_cast<std::size_t>(r)];
        e.killed_at_deadline = true;
        e.signal = SIGKILL;
        e.seconds = std::chrono::duration<double>(spec.deadline).count();
        c.done = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < spec.world_size; ++r) {
    Child& c = children[static_cast<std::size_t>(r)];
    result.ranks[static_cast<std::size_t>(r)].out = read_file(c.out_path);
    result.ranks[static_cast<std::size_t>(r)].err = read_file(c.err_path);
  }
  return result;
}

void remove_launch_dir(const std::string& dir) {
  if (dir.rfind("/tmp/gpumem-zero-launch-", 0) != 0) return;  // only what launch() made
  // POSIX calls, not std::filesystem: libtorch exports a std::filesystem of its own that has
  // crashed when tests called it. The directory is flat (files only).
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

}  // namespace gpumem::zero::testing
