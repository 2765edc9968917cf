// bench/viewer_keys: how fast `gpumem view` opens a large trace and answers keys.
//
//   viewer_keys [TRACE] [--entries N] [--width W] [--height H] [--write FILE]
//
// Without TRACE it writes a synthetic CSV trace of N entries (default 1,000,000: training-like
// steps that allocate a few thousand blocks of 512 B..32 MiB from 40 call sites, then free them,
// with segments created and released) to a temporary .csv.gz. It prints the time to open the file
// (read + gunzip + parse + model with checkpoints), then plays a script of keys that touches every
// view (timeline scrubbing, peak / OOM jumps, block cursor, zoom, search, the Active view's columns,
// time zoom and pan) and prints, per key kind,
// the time for reduce() plus a full render() of a W x H frame (default 200 x 60). --write FILE
// only writes the synthetic trace (--entries of them) to FILE.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <zlib.h>

#include "gpumem/forensics/csv_trace_reader.h"
#include "gpumem/view/render.h"
#include "gpumem/view/view_state.h"
#include "gpumem/view/viewer_model.h"

namespace vw = gpumem::view;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::size_t write_synthetic(const std::string& path, std::size_t entries) {
  gzFile f = gzopen(path.c_str(), "wb1");
  if (!f) throw std::runtime_error("cannot write " + path);
  gzbuffer(f, 1 << 20);
  std::string out = "action,addr,size,stream,time_us,where\n";
  std::mt19937_64 rng(42);
  constexpr std::uint64_t kBase = 0x7f0000000000, kSlot = 32ull << 20, kSlotsPerSeg = 32, kSeg = kSlot * kSlotsPerSeg;
  std::vector<std::string> sites;
  for (int i = 0; i < 40; ++i) sites.push_back(fmt::format("model.py:{}:layer{}_forward", 100 + i, i));
  std::map<std::uint64_t, int> seg_live;  // segment index -> live blocks
  std::size_t n = 0;
  std::int64_t t = 1'000'000;
  auto line = [&](const char* action, std::uint64_t addr, std::uint64_t size, const std::string& where) {
    out += fmt::format("{},{},{},0,{},{}\n", action, addr, size, t++, where);
    ++n;
    if (out.size() > (1 << 20)) {
      gzwrite(f, out.data(), static_cast<unsigned>(out.size()));
      out.clear();
    }
  };
  std::lognormal_distribution<double> size_dist(12.0, 2.5);
  while (n + 10 < entries) {
    const std::size_t blocks = 2000 + rng() % 2000;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> live;
    for (std::size_t b = 0; b < blocks && n + 10 < entries; ++b) {
      const std::uint64_t slot = (b * 7 + rng() % 3) % 4096;
      const std::uint64_t seg = slot / kSlotsPerSeg;
      const std::uint64_t addr = kBase + slot * kSlot;
      if (std::any_of(live.begin(), live.end(), [&](const auto& l) { return l.first == addr; })) continue;
      if (seg_live[seg]++ == 0) line("segment_alloc", kBase + seg * kSeg, kSeg, sites[seg % sites.size()]);
      const auto size = std::clamp<std::uint64_t>(static_cast<std::uint64_t>(size_dist(rng)), 512, kSlot);
      line("alloc", addr, size, sites[rng() % sites.size()]);
      live.emplace_back(addr, size);
    }
    std::shuffle(live.begin(), live.end(), rng);
    for (const auto& [addr, size] : live) {
      if (n + 4 >= entries) break;
      line("free_requested", addr, size, "");
      line("free_completed", addr, size, "");
      const std::uint64_t seg = (addr - kBase) / kSlot / kSlotsPerSeg;
      if (--seg_live[seg] == 0 && rng() % 4 == 0) {
        line("segment_free", kBase + seg * kSeg, kSeg, "");
      }
    }
  }
  line("oom", 0, 40ull << 30, sites[0]);
  gzwrite(f, out.data(), static_cast<unsigned>(out.size()));
  gzclose(f);
  return n;
}

struct Stat {
  std::vector<double> ms;
};

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  std::size_t entries = 1'000'000;
  vw::Size screen{200, 60};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--entries" && i + 1 < argc) entries = std::stoull(argv[++i]);
    else if (a == "--width" && i + 1 < argc) screen.width = std::stoi(argv[++i]);
    else if (a == "--height" && i + 1 < argc) screen.height = std::stoi(argv[++i]);
    else if (a == "--write" && i + 1 < argc) {
      const std::string out = argv[++i];
      fmt::print("wrote {} entries to {}\n", write_synthetic(out, entries), out);
      return 0;
    } else if (a == "-h" || a == "--help") {
      std::puts("usage: viewer_keys [TRACE] [--entries N] [--width W] [--height H] [--write FILE]");
      return 0;
    } else path = a;
  }
  std::string tmp;
  if (path.empty()) {
    tmp = (std::filesystem::temp_directory_path() / fmt::format("gpumem-viewer-bench-{}.csv.gz", getpid())).string();
    const auto t0 = Clock::now();
    const std::size_t n = write_synthetic(tmp, entries);
    fmt::print("synthetic trace: {} entries, {:.1f} MB gzip, written in {:.0f} ms\n", n,
               static_cast<double>(std::filesystem::file_size(tmp)) / 1e6, ms_since(t0));
    path = tmp;
  }

  // Open: what `gpumem view FILE` does before the first frame.
  const auto t_open = Clock::now();
  const auto model = vw::ViewerModel::open(path);
  const double open_ms = ms_since(t_open);
  const bool report_pending = model.oom_report_pending();
  auto t0 = Clock::now();
  vw::ViewState s = vw::initial_state(model, screen);
  const auto first = vw::render(s, model, screen);
  const double first_ms = ms_since(t0);
  fmt::print("open {}: {} entries, {} sites: {:.0f} ms; first frame ({}x{}) {:.1f} ms\n", path, model.entry_count(),
             model.trace().sites.size(), open_ms, screen.width, screen.height, first_ms);
  if (model.oom_cursor()) {
    // The forensics OOM report runs on a background thread; the keys below are timed after it.
    model.wait_for_oom_report();
    fmt::print("forensics OOM report (background thread): {} when the file opened; verdict '{}' ready {:.0f} ms after open began\n",
               report_pending ? "pending" : "done", model.oom_report() ? model.oom_report()->verdict : std::string("none"),
               ms_since(t_open));
  }
  // Where the open time goes (CSV traces): parsing the CSV, then the model (series, peaks, checkpoints).
  if (path.find(".csv") != std::string::npos) {
    t0 = Clock::now();
    auto trace = gpumem::forensics::read_csv_trace(path);
    const double read_ms = ms_since(t0);
    t0 = Clock::now();
    const auto rebuilt = vw::ViewerModel::from(std::move(trace));
    fmt::print("  of which: read + gunzip + parse the CSV {:.0f} ms, model with {} checkpoints {:.0f} ms\n", read_ms,
               (rebuilt.entry_count() + vw::kCheckpointEvery - 1) / vw::kCheckpointEvery, ms_since(t0));
  }

  // The key script: (label, key, repeat).
  struct Step {
    const char* label;
    vw::Key key;
    int repeat;
  };
  using vw::Key;
  using vw::KeyCode;
  const std::vector<Step> script = {
      {"view switch", Key::chr(U'3'), 1},       {"timeline ->", Key::of(KeyCode::right), 200},
      {"timeline <-", Key::of(KeyCode::left), 100}, {"timeline PgDn", Key::of(KeyCode::page_down), 20},
      {"jump peak reserved", Key::chr(U'p'), 3}, {"jump peak allocated", Key::chr(U'a'), 3},
      {"jump OOM", Key::chr(U'o'), 3},           {"timeline Home/End", Key::of(KeyCode::home), 3},
      {"step entry", Key::chr(U'.'), 50},        {"view switch", Key::chr(U'1'), 1},
      {"summary step", Key::chr(U']'), 20},      {"view switch", Key::chr(U'2'), 1},
      {"segments block ->", Key::of(KeyCode::right), 100}, {"segments segment v", Key::of(KeyCode::down), 30},
      {"segments zoom", Key::chr(U'+'), 6},      {"segments step", Key::chr(U']'), 20},
      {"view switch", Key::chr(U'4'), 1},        {"live select", Key::of(KeyCode::down), 30},
      {"live sort/group", Key::chr(U's'), 4},    {"live search", Key::chr(U'/'), 1},
      {"live search typing", Key::chr(U'l'), 1}, {"live search typing", Key::chr(U'a'), 1},
      {"live search typing", Key::of(KeyCode::enter), 1}, {"live step", Key::chr(U']'), 20},
      {"view switch", Key::chr(U'5'), 1},        {"pins select", Key::of(KeyCode::down), 30},
      {"pins step", Key::chr(U']'), 20},         {"mark", Key::chr(U'm'), 1},
      {"view switch", Key::chr(U'6'), 1},        {"diff step", Key::chr(U']'), 20},
      // The Active view: its first frame builds the grouped index (once per grouping, as g does).
      {"active: first frame", Key::chr(U'7'), 1}, {"active ->", Key::of(KeyCode::right), 100},
      {"active zoom +", Key::chr(U'+'), 8},      {"active PgDn", Key::of(KeyCode::page_down), 20},
      {"active <-", Key::of(KeyCode::left), 50}, {"active peak/end", Key::chr(U'e'), 2},
      {"active zoom -", Key::chr(U'-'), 8},      {"active jump", Key::chr(U'p'), 3},
      {"active: g (builds)", Key::chr(U'g'), 1}, {"active ->", Key::of(KeyCode::right), 20},
      {"help", Key::chr(U'?'), 2},
  };
  std::map<std::string, Stat> stats;
  std::vector<double> all;
  std::size_t checksum = first.to_text().size();
  for (const auto& st : script) {
    for (int r = 0; r < st.repeat; ++r) {
      const auto k0 = Clock::now();
      s = vw::reduce(s, st.key, model);
      const auto g = vw::render(s, model, screen);
      const double ms = ms_since(k0);
      checksum += g.at(0, 0).ch;
      stats[st.label].ms.push_back(ms);
      all.push_back(ms);
    }
  }
  fmt::print("\nkey -> reduce + full render of a {}x{} frame, ms\n", screen.width, screen.height);
  fmt::print("{:<22} {:>6} {:>8} {:>8} {:>8}\n", "key", "keys", "median", "mean", "max");
  auto row = [](const std::string& label, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    fmt::print("{:<22} {:>6} {:>8.2f} {:>8.2f} {:>8.2f}\n", label, v.size(), v[v.size() / 2], sum / static_cast<double>(v.size()),
               v.back());
  };
  for (const auto& [label, st] : stats) row(label, st.ms);
  row("ALL KEYS", all);
  const double worst = *std::max_element(all.begin(), all.end());
  fmt::print("\nopen {:.0f} ms ({} 1 s); slowest key {:.2f} ms ({} 30 ms)   [checksum {}]\n", open_ms,
             open_ms < 1000 ? "<" : ">=", worst, worst < 30 ? "<" : ">=", checksum);
  if (!tmp.empty()) std::filesystem::remove(tmp);
  return 0;
}
