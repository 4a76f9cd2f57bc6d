// A safetensors file's header and layout (engine/safetensors.h), as the loader reads a mapped
// file: every tensor it accepts lies inside the data and matches its shape and dtype.
#include <cstdint>
#include <cstdlib>

#include "engine/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tensors = hr::engine::parse_safetensors(data, size, "fuzz.safetensors");
  if (!tensors.is_ok()) return 0;
  for (const auto& [name, t] : *tensors) {
    if (t.data < data || t.data + t.num_bytes > data + size) std::abort();
    if (static_cast<size_t>(t.num_elements()) * hr::engine::dtype_size(t.dtype) != t.num_bytes) {
      std::abort();
    }
    // Touch every byte, as a read would.
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < t.num_bytes; ++i) sum = sum + t.data[i];
  }
  return 0;
}
