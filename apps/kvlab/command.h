// The CLI side of a subcommand: its FieldList (kvlab/core/config.h) bound to CLI11 flags, plus
// --config F.json and --print-config. Every subcommand is an options struct with `fields()`, a
// pure run function, and one add_command call in its setup function:
//
//   struct InspectOptions { std::string file; bool json = false; void fields(FieldList& f) {...} };
//   void run_inspect(const InspectOptions& o, const nlohmann::json& effective_config);
//   void setup_inspect(CLI::App& app) { add_command<InspectOptions>(app, "inspect", "...", run_inspect); }
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvlab/core/config.h"

namespace kvlab::cli {

class Command {
 public:
  Command(CLI::App& parent, const std::string& name, const std::string& description);
  FieldList& fields() { return fields_; }
  // Creates the CLI options from the field list. Call once, after fields are added.
  void bind();
  // Applies --config, validates (the fields, then the options' check()), and either prints the
  // config (returns false) or returns true.
  bool resolve();
  void set_check(std::function<void()> check) { check_ = std::move(check); }
  // The effective config (after the file and flag overrides).
  nlohmann::json effective() const { return fields_.to_json(); }
  CLI::App* app() { return app_; }

 private:
  CLI::App* app_;
  FieldList fields_;
  std::string config_path_;
  bool print_config_ = false;
  std::function<void()> check_;
  std::vector<CLI::Option*> options_;  // per field; nullptr for config-only (JSON) fields
};

// Options with `void check() const`: the checks of their values that read no file and load no
// model (bounds, names, methods and their parameters). They run before --print-config prints, so
// `kvlab run --dry-run`, which checks every step with --print-config, refuses what the step itself
// would refuse once it runs, except what depends on files (an earlier step may make them).
template <class T, class = void>
struct HasCheck : std::false_type {};
template <class T>
struct HasCheck<T, std::void_t<decltype(std::declval<const T&>().check())>> : std::true_type {};

// Adds subcommand `name` under `parent`: Options' fields become flags (and config keys), and
// `run(options, effective config)` is called when the subcommand is given (and none of its own).
template <class Options>
CLI::App* add_command(CLI::App& parent, const std::string& name, const std::string& description,
                      void (*run)(const Options&, const nlohmann::json&)) {
  auto opts = std::make_shared<Options>();
  auto cmd = std::make_shared<Command>(parent, name, description);
  opts->fields(cmd->fields());
  cmd->bind();
  if constexpr (HasCheck<Options>::value) cmd->set_check([o = opts.get()] { o->check(); });
  cmd->app()->callback([opts, cmd, run] {
    // A command with subcommands of its own (`longbench eval`) runs only when none was given.
    if (!cmd->app()->get_subcommands().empty()) return;
    if (cmd->resolve()) run(*opts, cmd->effective());
  });
  return cmd->app();
}

}  // namespace kvlab::cli
