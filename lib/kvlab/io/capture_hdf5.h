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
