// safetensors parsing and dtype conversion.
#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace hr::engine {

class MappedFile {
 public:
  ~MappedFile() {
    if (data_ != nullptr && size_ > 0) munmap(const_cast<uint8_t*>(data_), size_);
  }
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return invalid_argument("cannot open " + path + ": " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      ::close(fd);
      return invalid_argument("cannot stat " + path);
    }
    auto f = std::unique_ptr<MappedFile>(new MappedFile());
    f->path_ = path;
    f->size_ = static_cast<size_t>(st.st_size);
    if (f->size_ > 0) {
      void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        return invalid_argument("cannot mmap " + path);
      }
      f->data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    return f;
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

size_t dtype_size(DType d) { return d == DType::kF32 ? 4 : 2; }

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

SafetensorsModel::~SafetensorsModel() = default;

Result<std::unique_ptr<SafetensorsModel>> SafetensorsModel::open_file(const std::string& path) {
  auto m = std::unique_ptr<SafetensorsModel>(new SafetensorsModel());
  HR_RETURN_IF_ERROR(m->add_file(path));
  return m;
}

Result<std::unique_ptr<SafetensorsModel>> SafetensorsModel::open_dir(const std::string& dir) {
  auto m = std::unique_ptr<SafetensorsModel>(new SafetensorsModel());
  std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream index(index_path);
  if (!index) {
    HR_RETURN_IF_ERROR(m->add_file(dir + "/model.safetensors"));
    return m;
  }
  std::stringstream ss;
  ss << index.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return invalid_argument(index_path + ": not a valid index (needs a weight_map object)");
  }
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      return invalid_argument(index_path + ": weight_map[" + name + "] is not a file name");
    shards.insert(file.get<std::string>());
  }
  for (const std::string& shard : shards) HR_RETURN_IF_ERROR(m->add_file(dir + "/" + shard));
  for (const auto& [name, file] : j["weight_map"].items()) {
    auto it = m->tensors_.find(name);
    if (it == m->tensors_.end() || it->second.file != dir + "/" + file.get<std::string>()) {
      return invalid_argument(index_path + ": tensor " + name + " is not in " +
                              file.get<std::string>());
    }
  }
  return m;
}

Result<std::map<std::string, TensorView>> parse_safetensors(const uint8_t* data, size_t size,
                                                            const std::string& path) {
  if (size < 8) return invalid_argument(path + ": too small to be a safetensors file");
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len == 0 || header_len > 100u * 1024 * 1024 || header_len > size - 8) {
    return invalid_argument(path + ": corrupt header length " + std::to_string(header_len) +
                            " for a file of " + std::to_string(size) + " bytes");
  }
  auto header = nlohmann::json::parse(data + 8, data + 8 + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return invalid_argument(path + ": header is not a JSON object");
  }
  const uint8_t* base = data + 8 + header_len;
  size_t data_size = size - 8 - header_len;
  std::map<std::string, TensorView> tensors;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    std::string where = path + ": tensor " + name;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets")) {
      return invalid_argument(where + " lacks dtype, shape or data_offsets");
    }
    TensorView t;
    t.name = name;
    t.file = path;
    std::string dt = info["dtype"].is_string() ? info["dtype"].get<std::string>() : "";
    if (dt == "F32") {
      t.dtype = DType::kF32;
    } else if (dt == "F16") {
      t.dtype = DType::kF16;
    } else if (dt == "BF16") {
      t.dtype = DType::kBF16;
    } else {
      return invalid_argument(where + " has unsupported dtype '" + dt + "' (F32, F16, BF16)");
    }
    if (!info["shape"].is_array()) return invalid_argument(where + ": shape is not an array");
    for (const auto& d : info["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return invalid_argument(where + ": bad shape");
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      return invalid_argument(where + ": data_offsets must be two non-negative integers");
    }
    size_t begin = off[0].get<size_t>();
    size_t end = off[1].get<size_t>();
    if (begin > end || end > data_size) {
      return invalid_argument(where + ": data_offsets [" + std::to_string(begin) + ", " +
                              std::to_string(end) + ") run past the end of the file (truncated?)");
    }
    t.num_bytes = end - begin;
    if (static_cast<size_t>(t.num_elements()) * dtype_size(t.dtype) != t.num_bytes) {
      return invalid_argument(where + ": " + std::to_string(t.num_bytes) +
                              " bytes do not match its shape and dtype");
    }
    t.data = base + begin;
    ranges.emplace_back(begin, end);
    if (tensors.count(name)) return invalid_argument(where + " appears twice");
    tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return invalid_argument(path + ": tensors overlap in the data section");
    }
  }
  return tensors;
}

Status SafetensorsModel::add_file(const std::string& path) {
  HR_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  HR_ASSIGN_OR_RETURN(auto tensors, parse_safetensors(file->data(), file->size(), path));
  for (auto& [name, t] : tensors) {
    if (tensors_.count(name)) return invalid_argument(path + ": tensor " + name + " appears twice");
    tensors_.emplace(name, std::move(t));
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

void SafetensorsModel::prefetch(const TensorView& t) const {
  if (t.data == nullptr || t.num_bytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(t.data) + t.num_bytes;
  // Advice only: a failure leaves the pages to be read when touched.
  (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
}

const TensorView* SafetensorsModel::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<const TensorView*> SafetensorsModel::checked(const std::string& name,
                                                    const std::vector<int64_t>& shape) const {
  const TensorView* t = find(name);
  if (t == nullptr) return invalid_argument("missing tensor " + name, name);
  if (t->shape != shape) {
    auto str = [](const std::vector<int64_t>& s) {
      std::string o = "[";
      for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
      return o + "]";
    };
    return invalid_argument(
        "tensor " + name + " has shape " + str(t->shape) + ", expected " + str(shape), name);
  }
  return t;
}

Status SafetensorsModel::read_f32(const std::string& name, const std::vector<int64_t>& shape,
                                  float* out) const {
  HR_ASSIGN_OR_RETURN(const TensorView* t, checked(name, shape));
  int64_t n = t->num_elements();
  if (t->dtype == DType::kF32) {
    std::memcpy(out, t->data, static_cast<size_t>(n) * 4);
  } else {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(t->data);
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, src + i, 2);
      out[i] = t->dtype == DType::kBF16 ? bf16_to_f32(v) : f16_to_f32(v);
    }
  }
  return Status::ok();
}

Status SafetensorsModel::read_bf16(const std::string& name, const std::vector<int64_t>& shape,
                                   uint16_t* out) const {
  HR_ASSIGN_OR_RETURN(const TensorView* t, checked(name, shape));
  int64_t n = t->num_elements();
  if (t->dtype == DType::kBF16) {
    std::memcpy(out, t->data, static_cast<size_t>(n) * 2);
  } else if (t->dtype == DType::kF32) {
    for (int64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, t->data + 4 * i, 4);
      out[i] = f32_to_bf16(v);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, t->data + 2 * i, 2);
      out[i] = f32_to_bf16(f16_to_f32(v));
    }
  }
  return Status::ok();
}

}  // namespace hr::engine
