// Small string helpers: parsing flag values, replacing substrings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

std::vector<std::string> split(const std::string& s, char sep);
// All of `s` as an integer (std::stoll's syntax, nothing left over); nullopt when it is not one.
std::optional<int64_t> parse_int64(const std::string& s);
// Every occurrence of `from` replaced by `to`, left to right, without overlaps (Python's
// str.replace); an empty `from` leaves s as it is.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);
// "1,2,3" -> non-negative integers (token ids); an error naming the flag and the bad item.
std::vector<int64_t> parse_id_list(const std::string& s, const std::string& flag);
// "all" -> every index in [0, n); "0,1,4" or "0-3,7" -> those (each checked against n).
std::vector<int> parse_index_list(const std::string& spec, int n, const std::string& flag);
// "all" -> n; "last:256" -> min(256, n). Errors name the flag.
int64_t parse_queries_spec(const std::string& spec, int64_t n, const std::string& flag);
// Validates the spec's syntax without knowing n.
void check_queries_spec(const std::string& spec, const std::string& flag);

}  // namespace kvlab
