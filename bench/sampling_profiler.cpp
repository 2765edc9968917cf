// libgpumem_sampler.so: a sampling CPU profiler for the GPU host, which has no perf (issue 13: "find
// where the time goes before changing things"). Every 1/hz of the process's CPU time
// (ITIMER_PROF) the kernel sends SIGPROF to a thread that is running; the handler keeps the
// interrupted program counter and the return addresses above it (glibc's backtrace, which unwinds
// through the signal frame by the binaries' .eh_frame). At the end the samples are symbolized in
// the process itself (dladdr: the libraries' dynamic symbols, demangled) and written as a text
// report: inclusive shares of named groups (a sample counts in a group when any of its frames
// matches), the interrupted pc's objects, the top symbols by self and by inclusive samples.
//
// Two ways to use it:
//   * From Python (scripts/gpu/profile_step.py): ctypes.CDLL(path); gpumem_sampler_start(hz,
//     max_samples) around the code to profile; gpumem_sampler_stop(); gpumem_sampler_report(path,
//     groups).
//   * Preloaded into a program: GPUMEM_SAMPLER_OUT=report.txt [GPUMEM_SAMPLER_HZ=997]
//     [GPUMEM_SAMPLER_GROUPS=...] [GPUMEM_SAMPLER_MAX=200000] LD_PRELOAD=libgpumem_sampler.so PROGRAM: samples the whole run,
//     writes the report at exit (exit() or a return from main; not _exit()).
//
// Groups: "name=pattern|pattern;name=pattern" matched as substrings of "object symbol" (object =
// the library's file name). Default: kDefaultGroups below.
//
// Limits, said in the report's header: only dynamic symbols are named (a library's hidden
// functions show as object+offset, attributed to the nearest exported symbol by dladdr when one
// precedes them, so a symbol may stand for its hidden neighbours); frames the unwinder cannot
// cross (code without unwind tables) cut the stack short; samples beyond max_samples are dropped
// and counted.
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

constexpr int kMaxDepth = 40;
constexpr const char* kDefaultGroups =
    "gpumem allocator=gpumem::|libgpumem;"
    "PyTorch CUDA allocator (exported names)=CUDACachingAllocator;"
    // libc10_cuda.so hides most of its allocator's functions (they show as libc10_cuda.so+0x...);
    // the library also holds the device and stream lookups both allocators' callers make.
    "libc10_cuda.so (PyTorch's CUDA allocator, device and stream lookups)=libc10_cuda.so;"
    "c10 allocation profiling hooks=reportMemoryUsage|memoryProfilingEnabled|ThreadLocalDebugInfo;"
    "CUDA driver (libcuda)=libcuda.so;"
    "CUDA runtime (libcudart)=libcudart;"
    "Python interpreter=libpython|python3;"
    "PyTorch dispatcher=c10::Dispatcher|c10::impl::OperatorEntry|c10::KernelFunction;"
    "autograd=torch::autograd";

struct Sample {
  int tid;
  int depth;           // frames kept in pcs, the interrupted pc first
  bool unwound;        // the interrupted pc was found in the unwinder's stack
  void* pcs[kMaxDepth];
};

struct State {
  Sample* samples = nullptr;
  std::size_t capacity = 0;
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> dropped{0};
  std::atomic<bool> running{false};
  int hz = 0;
  struct timespec cpu_start {};
  struct timespec cpu_stop {};
  struct sigaction previous {};
};

State g_state;

void on_sigprof(int, siginfo_t*, void* context) {
  const int saved_errno = errno;
  if (!g_state.running.load(std::memory_order_relaxed)) {
    errno = saved_errno;
    return;
  }
  const std::size_t i = g_state.next.fetch_add(1, std::memory_order_relaxed);
  if (i >= g_state.capacity) {
    g_state.dropped.fetch_add(1, std::memory_order_relaxed);
    errno = saved_errno;
    return;
  }
  Sample& s = g_state.samples[i];
  s.tid = static_cast<int>(syscall(SYS_gettid));
  int depth = 0;
  void* interrupted = nullptr;
#if defined(__x86_64__)
  interrupted = reinterpret_cast<void*>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  interrupted = reinterpret_cast<void*>(static_cast<ucontext_t*>(context)->uc_mcontext.pc);
#else
  (void)context;
#endif
  void* raw[kMaxDepth + 4];
  const int n = backtrace(raw, kMaxDepth + 4);
  int from = -1;
  for (int k = 0; k < n; ++k) {
    if (raw[k] == interrupted) {
      from = k;
      break;
    }
  }
  if (from < 0) {  // the unwinder did not reach the interrupted frame: keep the pc alone
    s.pcs[0] = interrupted;
    depth = interrupted ? 1 : 0;
    s.unwound = false;
  } else {
    depth = std::min(n - from, kMaxDepth);
    std::memcpy(s.pcs, raw + from, sizeof(void*) * static_cast<std::size_t>(depth));
    s.unwound = true;
  }
  // Last, so that a sample still being written when the report runs reads as not taken.
  __atomic_store_n(&s.depth, depth, __ATOMIC_RELEASE);
  errno = saved_errno;
}

double seconds_between(const struct timespec& a, const struct timespec& b) {
  return static_cast<double>(b.tv_sec - a.tv_sec) + 1e-9 * static_cast<double>(b.tv_nsec - a.tv_nsec);
}

struct Symbol {
  std::string object;  // file name of the library
  std::string name;    // demangled symbol, or "object+0xoffset"
};

std::string base_name(const char* path) {
  if (path == nullptr || *path == '\0') return "?";
  const char* slash = std::strrchr(path, '/');
  return slash ? std::string(slash + 1) : std::string(path);
}

Symbol symbolize(void* pc) {
  Dl_info info{};
  if (dladdr(pc, &info) == 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "?+%p", pc);
    return {"?", buf};
  }
  Symbol sym;
  sym.object = base_name(info.dli_fname);
  if (info.dli_sname != nullptr) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status),
                                                     std::free);
    sym.name = (status == 0 && demangled) ? demangled.get() : info.dli_sname;
    // Templates make names of hundreds of characters; the report's columns keep the head.
    if (sym.name.size() > 160) sym.name = sym.name.substr(0, 157) + "...";
  } else {
    char buf[64];
    std::snprintf(buf, sizeof buf, "+0x%zx",
                  static_cast<std::size_t>(static_cast<char*>(pc) - static_cast<char*>(info.dli_fbase)));
    sym.name = sym.object + buf;
  }
  return sym;
}

struct Group {
  std::string name;
  std::vector<std::string> patterns;
};

// "name=a|b;name2=c" -> groups; an empty string -> none. Malformed parts (no '=' or nothing after
// it) are reported through `error` and make the parse fail.
bool parse_groups(const std::string& text, std::vector<Group>& out, std::string& error) {
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(pos, end - pos);
    if (!part.empty()) {
      const std::size_t eq = part.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 >= part.size()) {
        error = "group '" + part + "' is not NAME=PATTERN[|PATTERN...] (example: 'gpumem=gpumem::|libgpumem')";
        return false;
      }
      Group g{part.substr(0, eq), {}};
      std::size_t p = eq + 1;
      while (p <= part.size()) {
        std::size_t bar = part.find('|', p);
        if (bar == std::string::npos) bar = part.size();
        if (bar > p) g.patterns.push_back(part.substr(p, bar - p));
        p = bar + 1;
      }
      out.push_back(std::move(g));
    }
    pos = end + 1;
  }
  return true;
}

void print_table(std::FILE* f, const char* title, std::vector<std::pair<std::string, std::size_t>> rows,
                 std::size_t total, std::size_t limit) {
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  std::fprintf(f, "\n%s\n", title);
  std::size_t shown = 0;
  for (const auto& [name, count] : rows) {
    if (shown++ == limit) break;
    std::fprintf(f, "  %8zu  %6.2f%%  %s\n", count, total ? 100.0 * static_cast<double>(count) / static_cast<double>(total) : 0.0,
                 name.c_str());
  }
}

}  // namespace

extern "C" {

// Starts sampling at `hz` per second of the process's CPU time, keeping at most `max_samples`.
// Returns 0, or an errno value (EINVAL for a bad argument, EBUSY when already running, ENOMEM).
int gpumem_sampler_start(int hz, long max_samples) {
  if (hz <= 0 || hz > 100000 || max_samples <= 0) return EINVAL;
  if (g_state.running.load()) return EBUSY;
  delete[] g_state.samples;
  g_state.samples = new (std::nothrow) Sample[static_cast<std::size_t>(max_samples)]();  // depth 0: not taken
  if (g_state.samples == nullptr) return ENOMEM;
  g_state.capacity = static_cast<std::size_t>(max_samples);
  g_state.next.store(0);
  g_state.dropped.store(0);
  g_state.hz = hz;
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside the first signal
  struct sigaction sa {};
  sa.sa_sigaction = on_sigprof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, &g_state.previous) != 0) return errno;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &g_state.cpu_start);
  g_state.running.store(true);
  struct itimerval timer {};
  timer.it_interval.tv_sec = 0;
  timer.it_interval.tv_usec = std::max(1, 1000000 / hz);
  timer.it_value = timer.it_interval;
  if (setitimer(ITIMER_PROF, &timer, nullptr) != 0) {
    const int err = errno;
    g_state.running.store(false);
    sigaction(SIGPROF, &g_state.previous, nullptr);
    return err;
  }
  return 0;
}

// Stops sampling (the samples stay for the report). Returns the number kept.
long gpumem_sampler_stop(void) {
  struct itimerval off {};
  setitimer(ITIMER_PROF, &off, nullptr);
  if (g_state.running.exchange(false)) clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &g_state.cpu_stop);
  return static_cast<long>(std::min(g_state.next.load(), g_state.capacity));
}

// Whether `groups` is a valid groups string (null or "" = the defaults, valid). Returns 0, or
// EINVAL with the reason on stderr. A caller checks before sampling, so that a typo costs no run.
int gpumem_sampler_check_groups(const char* groups) {
  std::vector<Group> parsed;
  std::string error;
  if (groups == nullptr || *groups == '\0' || parse_groups(groups, parsed, error)) return 0;
  std::fprintf(stderr, "gpumem_sampler: %s\n", error.c_str());
  return EINVAL;
}

// Writes the report of the samples taken to `path` ("-" = stdout). `groups`: null or "" = the
// default groups. Returns 0, EINVAL for malformed groups (the reason on stderr), or the errno of
// opening the file.
int gpumem_sampler_report(const char* path, const char* groups) {
  gpumem_sampler_stop();
  std::vector<Group> parsed;
  std::string error;
  const std::string spec = (groups && *groups) ? groups : kDefaultGroups;
  if (!parse_groups(spec, parsed, error)) {
    std::fprintf(stderr, "gpumem_sampler: %s\n", error.c_str());
    return EINVAL;
  }
  std::FILE* f = (path == nullptr || std::strcmp(path, "-") == 0) ? stdout : std::fopen(path, "w");
  if (f == nullptr) {
    const int err = errno;
    std::fprintf(stderr, "gpumem_sampler: cannot write the report to %s: %s (give a writable path)\n", path,
                 std::strerror(err));
    return err;
  }
  const std::size_t n = std::min(g_state.next.load(), g_state.capacity);
  // Symbolize each distinct pc once. A return address is looked up one byte back (the call
  // instruction), so that a call that ends a function is not named after the next one.
  std::unordered_map<void*, int> symbol_of_pc;
  std::unordered_map<std::string, int> id_of_name;
  std::vector<Symbol> symbols;
  auto symbol_id = [&](void* pc, bool is_return) {
    void* key = is_return ? static_cast<char*>(pc) - 1 : pc;
    auto it = symbol_of_pc.find(key);
    if (it != symbol_of_pc.end()) return it->second;
    Symbol sym = symbolize(key);
    const std::string full = sym.object + "  " + sym.name;
    auto [nit, inserted] = id_of_name.emplace(full, static_cast<int>(symbols.size()));
    if (inserted) symbols.push_back(std::move(sym));
    symbol_of_pc.emplace(key, nit->second);
    return nit->second;
  };
  std::vector<std::size_t> self(0), incl(0);
  std::unordered_map<std::string, std::size_t> by_object;
  std::vector<std::size_t> group_count(parsed.size(), 0);
  std::unordered_set<int> tids;
  std::size_t unwound = 0, depth_sum = 0;
  std::vector<int> ids;
  for (std::size_t i = 0; i < n; ++i) {
    const Sample& s = g_state.samples[i];
    if (__atomic_load_n(&s.depth, __ATOMIC_ACQUIRE) <= 0) continue;
    tids.insert(s.tid);
    unwound += s.unwound ? 1 : 0;
    depth_sum += static_cast<std::size_t>(s.depth);
    ids.clear();
    for (int k = 0; k < s.depth; ++k) ids.push_back(symbol_id(s.pcs[k], k > 0));
    if (self.size() < symbols.size()) {
      self.resize(symbols.size(), 0);
      incl.resize(symbols.size(), 0);
    }
    ++self[static_cast<std::size_t>(ids[0])];
    ++by_object[symbols[static_cast<std::size_t>(ids[0])].object];
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int id : ids) ++incl[static_cast<std::size_t>(id)];
    for (std::size_t g = 0; g < parsed.size(); ++g) {
      bool hit = false;
      for (int id : ids) {
        const Symbol& sym = symbols[static_cast<std::size_t>(id)];
        for (const std::string& p : parsed[g].patterns) {
          if (sym.object.find(p) != std::string::npos || sym.name.find(p) != std::string::npos) {
            hit = true;
            break;
          }
        }
        if (hit) break;
      }
      group_count[g] += hit ? 1 : 0;
    }
  }
  const double cpu_s = seconds_between(g_state.cpu_start, g_state.cpu_stop);
  std::fprintf(f, "gpumem sampler: %zu samples at %d Hz of process CPU time (ITIMER_PROF) over %.3f s of CPU, "
               "%zu threads sampled, %zu dropped (buffer full), %zu of %zu unwound past the signal frame, "
               "%.1f frames a sample\n",
               n, g_state.hz, cpu_s, tids.size(), g_state.dropped.load(), unwound, n,
               n ? static_cast<double>(depth_sum) / static_cast<double>(n) : 0.0);
  std::fprintf(f, "effective rate: %.0f samples per CPU second (the kernel checks ITIMER_PROF at its tick, so "
               "the rate is at most about CONFIG_HZ per running thread)\n",
               cpu_s > 0 ? static_cast<double>(n) / cpu_s : 0.0);
  std::fprintf(f, "names: dynamic symbols only (dladdr); code without one is named object+offset or after the "
               "exported symbol before it\n");
  std::fprintf(f, "\ngroups (inclusive: a sample counts when any of its frames matches)\n");
  for (std::size_t g = 0; g < parsed.size(); ++g) {
    std::string pats;
    for (const auto& p : parsed[g].patterns) pats += (pats.empty() ? "" : "|") + p;
    std::fprintf(f, "  %8zu  %6.2f%%  %-32s (%s)\n", group_count[g],
                 n ? 100.0 * static_cast<double>(group_count[g]) / static_cast<double>(n) : 0.0, parsed[g].name.c_str(),
                 pats.c_str());
  }
  std::vector<std::pair<std::string, std::size_t>> rows;
  for (const auto& [obj, c] : by_object) rows.emplace_back(obj, c);
  print_table(f, "by object (the interrupted pc's)", rows, n, 25);
  rows.clear();
  for (std::size_t i = 0; i < self.size(); ++i)
    if (self[i]) rows.emplace_back(symbols[i].object + "  " + symbols[i].name, self[i]);
  print_table(f, "top symbols by self samples", rows, n, 40);
  rows.clear();
  for (std::size_t i = 0; i < incl.size(); ++i)
    if (incl[i]) rows.emplace_back(symbols[i].object + "  " + symbols[i].name, incl[i]);
  print_table(f, "top symbols by inclusive samples", rows, n, 60);
  if (f != stdout) std::fclose(f);
  return 0;
}

}  // extern "C"

namespace {

// Preloaded: GPUMEM_SAMPLER_OUT names the report; sampling runs from load to exit.
struct Preloaded {
  std::string out;
  std::string groups;  // "" = the defaults
  Preloaded() {
    const char* path = std::getenv("GPUMEM_SAMPLER_OUT");
    if (path == nullptr || *path == '\0') return;
    out = path;
    if (const char* g = std::getenv("GPUMEM_SAMPLER_GROUPS")) {
      // Checked now, not at exit: malformed groups fall back to the defaults and the run's
      // samples are still reported.
      if (gpumem_sampler_check_groups(g) == 0) {
        groups = g;
      } else {
        std::fprintf(stderr, "gpumem_sampler: GPUMEM_SAMPLER_GROUPS is not NAME=PATTERN[|PATTERN...][;...]; "
                     "reporting with the default groups\n");
      }
    }
    int hz = 997;
    if (const char* h = std::getenv("GPUMEM_SAMPLER_HZ")) {
      char* end = nullptr;
      const long v = std::strtol(h, &end, 10);
      if (end == h || *end != '\0' || v <= 0 || v > 100000) {
        std::fprintf(stderr, "gpumem_sampler: GPUMEM_SAMPLER_HZ=%s is not a rate in 1..100000; using 997\n", h);
      } else {
        hz = static_cast<int>(v);
      }
    }
    long max_samples = 200'000;  // 336 bytes each: 67 MB
    if (const char* m = std::getenv("GPUMEM_SAMPLER_MAX")) {
      char* end = nullptr;
      const long v = std::strtol(m, &end, 10);
      if (end == m || *end != '\0' || v <= 0) {
        std::fprintf(stderr, "gpumem_sampler: GPUMEM_SAMPLER_MAX=%s is not a positive count; using 200000\n", m);
      } else {
        max_samples = v;
      }
    }
    if (const int err = gpumem_sampler_start(hz, max_samples); err != 0)
      std::fprintf(stderr, "gpumem_sampler: could not start: %s\n", std::strerror(err));
  }
  ~Preloaded() {
    if (out.empty()) return;
    gpumem_sampler_report(out.c_str(), groups.c_str());
  }
};

Preloaded g_preloaded;

}  // namespace
