// gpumem::zero::parse_launch_env: torchrun's variables, validated with one clear error each.
#include "catch.h"

#include <gpumem/zero/launch_env.h>

#include <map>
#include <string>

using gpumem::zero::LaunchEnv;
using gpumem::zero::LaunchEnvError;
using gpumem::zero::parse_launch_env;

namespace {

LaunchEnv parse(const std::map<std::string, std::string>& vars) {
  return parse_launch_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::map<std::string, std::string> torchrun(std::string rank = "3", std::string world = "8") {
  return {{"RANK", rank},
          {"WORLD_SIZE", world},
          {"LOCAL_RANK", "1"},
          {"MASTER_ADDR", "node-0.cluster"},
          {"MASTER_PORT", "29500"}};
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    parse(vars);
  } catch (const LaunchEnvError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("no launcher variables is a single process, world of one", "[zero][launch]") {
  const LaunchEnv env = parse({});
  CHECK_FALSE(env.from_environment);
  CHECK(env.rank == 0);
  CHECK(env.world_size == 1);
  CHECK(env.local_rank == 0);
}

TEST_CASE("torchrun's variables are read", "[zero][launch]") {
  const LaunchEnv env = parse(torchrun());
  CHECK(env.from_environment);
  CHECK(env.rank == 3);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.master_addr == "node-0.cluster");
  CHECK(env.master_port == 29500);
  CHECK(gpumem::zero::describe(env).find("rank 3 of 8") != std::string::npos);
}

TEST_CASE("surrounding blanks are tolerated", "[zero][launch]") {
  auto vars = torchrun(" 2 ", "4\n");
  CHECK(parse(vars).rank == 2);
  CHECK(parse(vars).world_size == 4);
}

TEST_CASE("a partial set names the missing variables", "[zero][launch]") {
  auto vars = torchrun();
  vars.erase("MASTER_PORT");
  vars.erase("LOCAL_RANK");
  const std::string e = error_of(vars);
  CHECK(e.find("LOCAL_RANK, MASTER_PORT missing") != std::string::npos);
  CHECK(e.find("torchrun") != std::string::npos);
}

TEST_CASE("malformed and out-of-range values are rejected by name", "[zero][launch]") {
  CHECK(error_of(torchrun("abc")).find("RANK='abc' is not an integer") != std::string::npos);
  CHECK(error_of(torchrun("1.5")).find("RANK='1.5'") != std::string::npos);
  CHECK(error_of(torchrun("8", "8")).find("RANK=8 is not below WORLD_SIZE=8") != std::string::npos);
  CHECK(error_of(torchrun("-1")).find("RANK=-1 is out of range") != std::string::npos);
  CHECK(error_of(torchrun("0", "0")).find("WORLD_SIZE=0 is out of range") != std::string::npos);

  auto port = torchrun();
  port["MASTER_PORT"] = "70000";
  CHECK(error_of(port).find("MASTER_PORT=70000 is out of range") != std::string::npos);
  port["MASTER_PORT"] = "0";
  CHECK(error_of(port).find("MASTER_PORT=0") != std::string::npos);

  auto addr = torchrun();
  addr["MASTER_ADDR"] = "  ";
  CHECK(error_of(addr).find("MASTER_ADDR is empty") != std::string::npos);

  auto local = torchrun();
  local["LOCAL_RANK"] = "x";
  CHECK(error_of(local).find("LOCAL_RANK='x'") != std::string::npos);
}

TEST_CASE("torchrun's agent store makes every rank a client", "[zero][launch]") {
  CHECK_FALSE(parse(torchrun()).agent_store);  // rank 0 serves the store
  auto vars = torchrun("0", "2");
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";  // what torchrun sets
  const LaunchEnv env = parse(vars);
  CHECK(env.agent_store);
  CHECK(gpumem::zero::describe(env).find("served by the launcher's agent") != std::string::npos);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  CHECK_FALSE(parse(vars).agent_store);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "yes";
  CHECK(error_of(vars).find("TORCHELASTIC_USE_AGENT_STORE='yes' is neither True nor False") !=
        std::string::npos);
}
