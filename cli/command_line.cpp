#include "command_line.h"

#include <charconv>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace gpumem::cli {

CommandLine::CommandLine(std::string_view command, std::string help) : command_(command), help_(std::move(help)) {}

void CommandLine::add(std::string_view name, Handler take) {
  for (const Option& o : options_) {
    if (o.name == name) throw std::logic_error(fmt::format("gpumem {}: option {} declared twice", command_, name));
  }
  options_.push_back(Option{std::string(name), std::move(take)});
}

void CommandLine::flag(std::string_view name, bool& target, bool value) {
  add(name, [&target, value](ArgReader& r, std::string_view) {
    r.take_flag();
    target = value;
  });
}

void CommandLine::value(std::string_view name, std::string& target) {
  add(name, [&target](ArgReader& r, std::string_view) { target = std::string(r.take_value()); });
}

void CommandLine::values(std::string_view name, std::vector<std::string>& target) {
  add(name, [&target](ArgReader& r, std::string_view) { target.emplace_back(r.take_value()); });
}

void CommandLine::add_integer(std::string_view name, std::int64_t lo, std::int64_t hi,
                              std::function<void(std::int64_t)> store, std::string what) {
  if (what.empty()) what = fmt::format("a number from {} to {}", lo, hi);
  add(name, [lo, hi, store = std::move(store), what = std::move(what)](ArgReader& r, std::string_view n) {
    const std::string_view v = r.take_value();
    std::int64_t number = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), number);
    if (ec != std::errc() || end != v.data() + v.size() || number < lo || number > hi) {
      r.fail(fmt::format("{} takes {}, not '{}'", n, what, v));
    }
    store(number);
  });
}

void CommandLine::size(std::string_view name, std::size_t& target) {
  add(name, [&target](ArgReader& r, std::string_view n) {
    const std::string_view v = r.take_value();
    const auto bytes = parse_size(v);
    if (!bytes) {
      r.fail(fmt::format("{} takes a size with a unit such as 8GiB or 512MiB (B, KiB, MiB, GiB, TiB; MB means MiB, as in "
                         "the configuration's *_mb keys), not '{}'",
                         n, v));
    }
    target = *bytes;
  });
}

void CommandLine::choice(std::string_view name, std::vector<std::string> choices, std::string& target) {
  std::string listed;  // "a, b or c"
  for (std::size_t i = 0; i < choices.size(); ++i) {
    listed += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  add(name, [&target, choices = std::move(choices), listed = std::move(listed)](ArgReader& r, std::string_view n) {
    const std::string_view v = r.take_value();
    for (const std::string& c : choices) {
      if (c == v) {
        target = c;
        return;
      }
    }
    r.fail(fmt::format("{} takes {}, not '{}'", n, listed, v));
  });
}

void CommandLine::declare_positional(Positional p) {
  if (positional_.one || positional_.many) {
    throw std::logic_error(fmt::format("gpumem {}: positional arguments declared twice", command_));
  }
  positional_ = std::move(p);
}

void CommandLine::positional(std::string& target, std::string noun, std::string missing, std::string extra_hint) {
  declare_positional(Positional{&target, nullptr, std::move(noun), std::move(missing), std::move(extra_hint)});
}

void CommandLine::positionals(std::vector<std::string>& target) {
  Positional p;
  p.many = &target;
  declare_positional(std::move(p));
}

void CommandLine::take_positional(ArgReader& r, std::string_view arg) {
  Positional& p = positional_;
  if (p.many) {
    p.many->emplace_back(arg);
  } else if (!p.one) {
    r.fail(fmt::format("unexpected argument '{}'", arg));
  } else if (arg.empty()) {  // `gpumem report "$FILE"` with FILE unset
    r.fail(fmt::format("no {} given: {}", p.noun, p.missing));
  } else if (p.seen) {
    r.fail(fmt::format("one {} at a time: got '{}' and '{}'{}", p.noun, *p.one, arg, p.extra_hint));
  } else {
    *p.one = std::string(arg);
    p.seen = true;
  }
}

std::optional<int> CommandLine::parse(const std::vector<std::string_view>& args, std::FILE* out, std::FILE* err) {
  positional_.seen = false;
  try {
    ArgReader r(command_, args);
    while (!r.done()) {
      if (!r.at_option()) {
        take_positional(r, r.take_positional());
        continue;
      }
      const std::string_view name = r.option_name();
      if (name == "-h" || name == "--help") {
        std::fputs(help_.c_str(), out);
        return 0;
      }
      const Option* option = nullptr;
      for (const Option& o : options_) {
        if (o.name == name) option = &o;
      }
      if (!option) r.fail(fmt::format("unknown option '{}'", name));
      option->take(r, name);
    }
    if (positional_.one && !positional_.seen) {
      r.fail(fmt::format("no {} given: {}", positional_.noun, positional_.missing));
    }
  } catch (const UsageError& e) {
    std::fputs(fmt::format("{}\n", e.what()).c_str(), err);
    return 2;
  }
  return std::nullopt;
}

int CommandLine::usage_error(std::string_view what, std::FILE* err) const {
  std::fputs(fmt::format("{}\n", usage_message(command_, what)).c_str(), err);
  return 2;
}

}  // namespace gpumem::cli
