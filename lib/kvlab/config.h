// One list of fields per subcommand serves three purposes: CLI flags, the JSON config file
// (`--config F.json`, flags override it, unknown keys are errors) and `--print-config`.
//
//   struct InspectOptions { std::string file; bool json = false;
//     void fields(FieldList& f) { f.add("file", file, "capture file").positional();
//                                 f.add("json", json, "machine-readable output"); } };
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

namespace CLI {
class App;
}

namespace kvlab {

class FieldList {
 public:
  using Target = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*,
                              std::vector<std::string>*, std::vector<double>*,
                              std::vector<int64_t>*, nlohmann::json*>;
  struct Field {
    std::string key;   // JSON key; the flag is --key with '_' -> '-'
    Target target;
    std::string help;
    bool positional = false;
    bool required = false;
    std::vector<std::string> allowed;  // for strings: the accepted values
    std::string flag() const;
  };

  template <class T>
  FieldList& add(const std::string& key, T& target, const std::string& help) {
    fields_.push_back(Field{key, &target, help});
    return *this;
  }
  FieldList& positional() { fields_.back().positional = true; return *this; }
  FieldList& required() { fields_.back().required = true; return *this; }
  FieldList& one_of(std::vector<std::string> allowed) {
    fields_.back().allowed = std::move(allowed);
    return *this;
  }

  const std::vector<Field>& fields() const { return fields_; }
  nlohmann::json to_json() const;
  // Sets every field present in `j`; a key that is not a field is an error naming it (and the
  // closest field); a value of the wrong type is an error naming the key, expected and found.
  void from_json(const nlohmann::json& j, const std::string& source, bool skip_given_on_cli);

 private:
  friend class Command;
  std::vector<Field> fields_;
  std::vector<bool> given_on_cli_;
};

// Wires a FieldList into a CLI11 subcommand and adds --config / --print-config.
// Usage in cmd_X.cpp:
//   auto cmd = std::make_shared<Command>(app, "inspect", "Summarise a capture file");
//   opts.fields(cmd->fields()); cmd->bind();
//   cmd->callback([opts = ...] { ... });
class Command {
 public:
  Command(CLI::App& parent, const std::string& name, const std::string& description);
  FieldList& fields() { return fields_; }
  // Creates the CLI options from the field list. Call once, after fields are added.
  void bind();
  // Applies --config, validates, and either prints the config (returns false) or returns true.
  bool resolve();
  // The effective config (after the file and flag overrides).
  nlohmann::json effective() const { return fields_.to_json(); }
  CLI::App* app() { return app_; }

 private:
  CLI::App* app_;
  FieldList fields_;
  std::string config_path_;
  bool print_config_ = false;
  std::vector<void*> options_;  // CLI::Option* per field
};

// Read a JSON file, with the file name and position in any parse error.
nlohmann::json read_json_file(const std::string& path);
// Closest candidate by edit distance, or "" if none is close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace kvlab
