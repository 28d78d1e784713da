#include "command.h"

#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <variant>

#include "kvlab/core/check.h"

namespace kvlab::cli {

Command::Command(CLI::App& parent, const std::string& name, const std::string& description)
    : app_(parent.add_subcommand(name, description)) {}

void Command::bind() {
  for (const auto& f : fields_.fields()) {
    std::string spec = f.positional ? f.key : f.flag();
    CLI::Option* opt = std::visit(
        Overloaded{[&](bool* p) -> CLI::Option* { return app_->add_flag(spec, *p, f.help); },
                   [&](nlohmann::json* p) -> CLI::Option* {
                     // JSON-valued fields are only settable from the config file.
                     return nullptr;
                   },
                   [&](auto* p) -> CLI::Option* { return app_->add_option(spec, *p, f.help); }},
        f.target);
    if (opt && !f.allowed.empty()) opt->check(CLI::IsMember(f.allowed));
    // Lists accept "0.1,0.2" as well as repeated flags.
    bool is_list = std::holds_alternative<std::vector<std::string>*>(f.target) ||
                   std::holds_alternative<std::vector<double>*>(f.target) ||
                   std::holds_alternative<std::vector<int64_t>*>(f.target);
    if (opt && is_list) opt->delimiter(',');
    options_.push_back(opt);
  }
  app_->add_option("--config", config_path_,
                   "JSON file standing in for this command's flags (flags override it)");
  app_->add_flag("--print-config", print_config_, "print the effective config as JSON and exit");
}

bool Command::resolve() {
  std::vector<bool> given(fields_.fields().size(), false);
  for (size_t i = 0; i < options_.size(); ++i) given[i] = options_[i] && options_[i]->count() > 0;
  fields_.set_given_on_cli(std::move(given));
  if (!config_path_.empty())
    fields_.from_json(read_json_file(config_path_), config_path_, /*skip_given_on_cli=*/true);
  // "inf" and "nan" parse as numbers on the command line (JSON has neither): no number flag means
  // them (issue 26: buzz-steady --t-over-w inf, tsne --learning-rate nan ran).
  for (size_t i = 0; i < fields_.fields().size(); ++i) {
    const auto& f = fields_.fields()[i];
    auto finite = [&](double v) {
      KVLAB_CHECK(std::isfinite(v), "{} must be a finite number, got {}", f.positional ? f.key : f.flag(), v);
    };
    std::visit(Overloaded{[&](double* p) { finite(*p); },
                          [&](std::vector<double>* p) { for (double v : *p) finite(v); },
                          [](auto*) {}},
               f.target);
    // Each value of a list once (issue 50: --ratio 0.5,0.5 ran one branch twice into one file).
    std::visit(Overloaded{[&](std::vector<double>* p) { check_listed_once(f.positional ? f.key : f.flag(), *p); },
                          [&](std::vector<int64_t>* p) { check_listed_once(f.positional ? f.key : f.flag(), *p); },
                          [&](std::vector<std::string>* p) { check_listed_once(f.positional ? f.key : f.flag(), *p); },
                          [](auto*) {}},
               f.target);
  }
  for (size_t i = 0; i < fields_.fields().size(); ++i) {
    const auto& f = fields_.fields()[i];
    if (!f.required) continue;
    // A required list (ruler eval's folders) needs one value at least (issue 50: none was SIGSEGV).
    bool empty = std::visit(Overloaded{[](std::string* p) { return p->empty(); },
                                       [](std::vector<std::string>* p) { return p->empty(); },
                                       [](std::vector<double>* p) { return p->empty(); },
                                       [](std::vector<int64_t>* p) { return p->empty(); },
                                       [](auto*) { return false; }},
                            f.target);
    KVLAB_CHECK(!empty, "{} is required (or set '{}' in --config)", f.positional ? f.key : f.flag(),
                f.key);
  }
  if (check_) check_();
  if (print_config_) {
    std::cout << fields_.to_json().dump(2) << "\n";
    return false;
  }
  return true;
}

}  // namespace kvlab::cli
