// SHA-256 (FIPS 180-4) as 64 hex digits: the config hash of every result.json, and the digest of a
// capture that `kvlab run` keeps in its sidecar. Written here to avoid an OpenSSL dependency.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvlab {

std::string sha256_hex(const std::string& data);
// Of a file's bytes, read in 1 MiB blocks (captures may be gigabytes); an error names the file.
std::string sha256_file_hex(const std::string& path);

// Incremental form: update() any number of times, then hex_digest() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex_digest();

 private:
  void block(const unsigned char* p);  // one 64-byte block
  std::array<uint32_t, 8> h_;
  std::array<unsigned char, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes
};

}  // namespace kvlab
