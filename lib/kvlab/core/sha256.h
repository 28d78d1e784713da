// SHA-256 (FIPS 180-4) of a string, as 64 hex digits: the config hash of every result.json and
// of `kvlab run`'s capture sidecars. Written here to avoid an OpenSSL dependency for one hash.
#pragma once

#include <string>

namespace kvlab {

std::string sha256_hex(const std::string& data);

}  // namespace kvlab
