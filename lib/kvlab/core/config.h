// One list of fields per subcommand serves three purposes: CLI flags, the JSON config file
// (`--config F.json`, flags override it, unknown keys are errors) and `--print-config`. The
// binding to CLI11 lives with the CLI (apps/kvlab/command.h); the library never sees CLI11.
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

namespace kvlab {

// std::visit over several lambdas (for FieldList::Target).
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

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

 // Which fields were given as flags (parallel to fields()); from_json(skip_given_on_cli=true)
  // leaves those alone, so flags override the config file.
  void set_given_on_cli(std::vector<bool> given) { given_on_cli_ = std::move(given); }

 private:
  std::vector<Field> fields_;
  std::vector<bool> given_on_cli_;
};

// Read a JSON file, with the file name and position in any parse error. A key given twice in one
// object, or arrays and objects nested deeper than kMaxJsonDepth, are errors naming the file.
constexpr int kMaxJsonDepth = 64;
nlohmann::json read_json_file(const std::string& path);
// A list flag names each value once (issue 50: --ratio 0.5,0.5 ran one branch twice into one
// prediction file): otherwise an error naming the flag and the repeated value. Command::resolve
// applies it to every list field, from the command line or --config.
void check_listed_once(const std::string& flag, const std::vector<double>& values);
void check_listed_once(const std::string& flag, const std::vector<int64_t>& values);
void check_listed_once(const std::string& flag, const std::vector<std::string>& values);
// A text file's bytes; `flag` names where the path came from in the one-line error (not a regular
// file, unreadable).
std::string read_text_file(const std::string& path, const std::string& flag);
// The values of a JSON-lines file, one per non-empty line; none when the file cannot be opened.
std::vector<nlohmann::json> read_json_lines(const std::string& path);
// Closest candidate by edit distance, or "" if none is close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace kvlab
