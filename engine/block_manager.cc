// Paged KV block bookkeeping with prefix caching.
#include "engine/block_manager.h"

#include <algorithm>

#include "base/check.h"

namespace hr::engine {

BlockManager::BlockManager(int num_blocks, int block_size)
    : block_size_(block_size), blocks_(static_cast<size_t>(num_blocks)) {
  HR_CHECK_GT(num_blocks, 0);
  HR_CHECK_GT(block_size, 0);
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

uint64_t BlockManager::chain_hash(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 0x100000001b3ull;
    h ^= h >> 29;
  }
  return h == 0 ? 1 : h;
}

uint64_t BlockManager::namespace_root(std::string_view name) {
  if (name.empty()) return 0;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a finalising mix
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h == 0 ? 1 : h;
}

uint64_t CacheChain::parent(size_t i, const std::vector<uint64_t>& hashes) const {
  if (i == 0) return root;
  if (shared_blocks > 0 && i == static_cast<size_t>(shared_blocks)) {
    // Into the account's own namespace: the public chain mixed with the account's root.
    uint64_t h = hashes[i - 1] ^ (own_root * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return h == 0 ? 1 : h;
  }
  return hashes[i - 1];
}

int BlockManager::acquire_prefix(const std::vector<int32_t>& tokens, int max_tokens,
                                 const CacheChain& chain, std::vector<int>* blocks,
                                 std::vector<uint64_t>* hashes) {
  int covered = 0;
  for (int start = static_cast<int>(blocks->size()) * block_size_;
       start + block_size_ <= std::min<int>(max_tokens, static_cast<int>(tokens.size()));
       start += block_size_) {
    ++num_queries_;
    uint64_t h =
        chain_hash(chain.parent(hashes->size(), *hashes), tokens.data() + start, block_size_);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    Block& b = blocks_[static_cast<size_t>(it->second)];
    if (!std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin() + start)) break;
    if (b.in_lru) {
      lru_.erase(b.lru_pos);
      b.in_lru = false;
    }
    ++b.ref;
    ++num_hits_;
    blocks->push_back(it->second);
    hashes->push_back(h);
    covered += block_size_;
  }
  return covered;
}

void BlockManager::uncache(int id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.hash != 0) {
    auto it = by_hash_.find(b.hash);
    if (it != by_hash_.end() && it->second == id) by_hash_.erase(it);
  }
  b.hash = 0;
  b.tokens.clear();
}

std::optional<int> BlockManager::allocate() {
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    id = lru_.front();
    lru_.pop_front();
    blocks_[static_cast<size_t>(id)].in_lru = false;
    uncache(id);
  } else {
    return std::nullopt;
  }
  Block& b = blocks_[static_cast<size_t>(id)];
  HR_CHECK_EQ(b.ref, 0);
  b.ref = 1;
  return id;
}

void BlockManager::release(const std::vector<int>& ids) {
  for (int id : ids) {
    Block& b = blocks_[static_cast<size_t>(id)];
    HR_CHECK_GT(b.ref, 0) << "block " << id << " released twice";
    if (--b.ref > 0) continue;
    if (b.hash != 0) {
      lru_.push_back(id);
      b.lru_pos = std::prev(lru_.end());
      b.in_lru = true;
    } else {
      free_.push_back(id);
    }
  }
}

void BlockManager::forget_cached() {
  for (int id : lru_) {
    blocks_[static_cast<size_t>(id)].in_lru = false;
    uncache(id);
    free_.push_back(id);
  }
  lru_.clear();
  for (const auto& [hash, id] : by_hash_) {  // cached blocks still in use
    blocks_[static_cast<size_t>(id)].hash = 0;
    blocks_[static_cast<size_t>(id)].tokens.clear();
  }
  by_hash_.clear();
}

uint64_t BlockManager::commit_full(int id, uint64_t parent_hash, const int32_t* tokens) {
  Block& b = blocks_[static_cast<size_t>(id)];
  uint64_t h = chain_hash(parent_hash, tokens, block_size_);
  if (b.hash == h) return h;
  auto it = by_hash_.find(h);
  if (it == by_hash_.end()) {
    b.hash = h;
    b.tokens.assign(tokens, tokens + block_size_);
    by_hash_[h] = id;
  }
  // Otherwise another block already caches this content; this one stays private.
  return h;
}

}  // namespace hr::engine
