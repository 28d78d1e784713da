// HDF5 pieces shared by the capture writer (capture.cpp) and reader (capture_reader.cpp).
// Internal to lib/kvlab/io: callers use capture.h.
#pragma once

#include <ATen/ATen.h>
#include <H5Cpp.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvlab::capture_detail {

// Once per process, before any HDF5 call: HDF5 prints nothing (H5::Exception::dontPrint()); a
// failing HDF5 call instead records the innermost messages of its error stack for
// take_hdf5_error(); and HDF5 loads no filter plugins (a file may name any filter id, and HDF5
// would dlopen whatever HDF5_PLUGIN_PATH offers for it).
void init_hdf5();

// The innermost messages of the HDF5 calls that failed since the last take, on one line
// (e.g. "data error detected by Fletcher32 checksum"); "" if none failed. Clears them.
std::string take_hdf5_error();

// The file type of q/k/v for a storage dtype (see docs/capture-format.md, Storage).
H5::DataType float_file_type(at::ScalarType t);
// A fixed-length string of n >= 1 bytes, NUL-padded, UTF-8: stored in the attribute itself, so
// reading it never goes through HDF5's global heap (as variable-length strings do).
H5::StrType fixed_string_type(size_t n);
bool is_utf8(std::string_view s);

std::string sample_name(int64_t i);  // "sample_0007"
std::string layer_name(int layer);   // "layer_05"

}  // namespace kvlab::capture_detail

namespace kvlab::capture_detail {

// The bytes of a capture (a file on disk or a copy of a file image), by HDF5 file address.
class RawBytes {
 public:
  RawBytes() = default;
  static RawBytes of_file(const std::string& path, uint64_t base);
  static RawBytes of_image(const void* data, size_t size, uint64_t base);
  // n bytes at address addr (counted from HDF5's base address, the user block's end); false if
  // they are not all in the file.
  bool read(uint64_t addr, size_t n, uint8_t* out) const;
  uint64_t size() const;  // bytes from the base address to the end
  void set_base(uint64_t base);

 private:
  std::string path_, image_;
  bool is_image_ = false;
  uint64_t base_ = 0, size_ = 0;
};

// Checks, from the file's bytes, the (version-1) object header at `addr` of a group or a dataset,
// before HDF5 decodes its messages: every message is of a type a kvlab capture holds (for a group:
// symbol table, attributes, modification time; for a dataset: dataspace, datatype, fill value,
// layout, filter pipeline, ...), and its contents (sizes, counts, names and their NUL) lie inside
// it; attributes are plain integers, floats or fixed-length strings, scalars or lists. HDF5 1.10
// trusts these sizes when it decodes a message and reads past a corrupted one (seen: SEGV under
// H5Aexists in the attribute decoder, a heap over-read under H5Dopen in the filter pipeline's;
// bounds checks came upstream in 1.14.1, HDFGroup/hdf5#2749). Version-2 headers, which kvlab
// never writes, are refused. Returns "" if all hold, else what does not.
std::string check_object_header(const RawBytes& bytes, uint64_t addr, bool dataset);

// Checks a version-0/1 superblock (at bytes' address 0) before HDF5 opens the file: 8-byte
// addresses and lengths, and the end of file it records is the file's (kvlab writes both so; HDF5
// 1.10 refuses a file longer or shorter, and keeps ~400 bytes of each failed open). Sets bytes'
// base address to the superblock's and *root to the root group's object header, which HDF5's open
// reads: check it too (check_object_header) first. "" when all hold, or when the file does not
// start with HDF5's signature (HDF5 then says what the file is not).
std::string check_superblock(RawBytes& bytes, uint64_t* root);

}  // namespace kvlab::capture_detail
