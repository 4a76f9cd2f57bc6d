// Memory-mapped safetensors files: one file, or several through model.safetensors.index.json.
// Validates the header (size, JSON, dtypes, shapes, offsets within the file, no overlaps) and
// names the tensor and file in every error. Read-only after open; safe to share between threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace hr::engine {

enum class DType { kF32, kF16, kBF16 };
const char* dtype_name(DType d);
size_t dtype_size(DType d);

struct TensorView {
  std::string name;
  std::string file;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping
  size_t num_bytes = 0;
  int64_t num_elements() const;
};

class MappedFile;

class SafetensorsModel {
 public:
  // Opens `dir`/model.safetensors, or the shards listed in `dir`/model.safetensors.index.json.
  [[nodiscard]] static Result<std::unique_ptr<SafetensorsModel>> open_dir(const std::string& dir);
  // Opens one file.
  [[nodiscard]] static Result<std::unique_ptr<SafetensorsModel>> open_file(const std::string& path);
  ~SafetensorsModel();

  const TensorView* find(const std::string& name) const;
  // Asks the kernel to start reading the tensor's pages from the disk now (madvise WILLNEED on the
  // mapping; returns at once), so that a loader converting one tensor has the next ones coming
  // in meanwhile and a cold load runs at the drive's speed.
  void prefetch(const TensorView& t) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // Copies the tensor into fp32 (converting f16/bf16); errors when the shape differs.
  [[nodiscard]] Status read_f32(const std::string& name, const std::vector<int64_t>& shape,
                                float* out) const;
  // The same into bf16 (copied as is when the file holds bf16, else rounded to nearest even).
  [[nodiscard]] Status read_bf16(const std::string& name, const std::vector<int64_t>& shape,
                                 uint16_t* out) const;

 private:
  SafetensorsModel() = default;
  Status add_file(const std::string& path);
  // The tensor, when it exists with this shape; errors name it.
  Result<const TensorView*> checked(const std::string& name,
                                    const std::vector<int64_t>& shape) const;

  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

// The tensors of a safetensors file held in memory (`data`, `size` bytes), pointing into it; `path`
// names the file in errors. Checks the header length, that every tensor's dtype, shape and data
// offsets agree and lie inside the data section, and that no two overlap.
[[nodiscard]] Result<std::map<std::string, TensorView>> parse_safetensors(const uint8_t* data,
                                                                          size_t size,
                                                                          const std::string& path);

float bf16_to_f32(uint16_t v);
float f16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float v);  // round to nearest even

}  // namespace hr::engine
