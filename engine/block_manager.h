// The paged KV cache's bookkeeping: fixed-size blocks with reference counts, and prefix caching.
// A full block is identified by a hash chain over (parent hash, its token ids); unreferenced
// cached blocks stay in LRU order and are evicted only when a new block is needed. Cached blocks
// also keep their token ids, so a hash collision can never return wrong K/V. Plain C++ (no backend
// memory); used by the scheduler's thread only.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hr::engine {

// Where a sequence's chain of block hashes starts, and where it changes namespace. Blocks of a
// prefix that the operator made public (WorkerConfig::public_prefixes) chain from kPublicRoot and
// are shared by every account; the first block after them chains from the last public block's
// hash mixed with the account's own root, so that whatever follows a public prefix is shared
// within the account alone. Without a public prefix, every block chains from `own_root`.
struct CacheChain {
  static constexpr uint64_t kPublicRoot = 0x7075626c69630001ull;
  uint64_t root = 0;      // the first block's parent
  int shared_blocks = 0;  // leading blocks of a public prefix (0: none)
  uint64_t own_root = 0;  // the account's namespace root
  // The parent hash of block `i`, given the hashes of blocks [0, i).
  uint64_t parent(size_t i, const std::vector<uint64_t>& hashes) const;
  static CacheChain own(uint64_t own_root) { return {own_root, 0, own_root}; }
};

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  // Blocks that can be handed out now: free plus unreferenced cached ones.
  int num_available() const { return static_cast<int>(free_.size() + lru_.size()); }
  int num_cached() const { return static_cast<int>(by_hash_.size()); }

  // Finds cached blocks holding the longest run of full blocks at the start of `tokens`, covering
  // at most `max_tokens` tokens; takes a reference on each and appends them and their hashes.
  // Returns the number of tokens covered. `chain` gives each block's parent hash: the first
  // from a namespace's root (namespace_root), so that only sequences of one namespace share
  // blocks (CacheChain: a public prefix's blocks are shared, what follows them is not).
  int acquire_prefix(const std::vector<int32_t>& tokens, int max_tokens, const CacheChain& chain,
                     std::vector<int>* blocks, std::vector<uint64_t>* hashes);
  // The root of a namespace's hash chains: 0 for the empty name (shared by every sequence without
  // one), else a 64-bit hash of the name.
  static uint64_t namespace_root(std::string_view name);
  // A new empty block with one reference, evicting the least recently used cached block if
  // needed; nullopt when none is available.
  std::optional<int> allocate();
  // Drops one reference from each block; unreferenced cached blocks join the LRU list.
  void release(const std::vector<int>& blocks);
  // Marks `block` as holding the full block `tokens[0, block_size)` after `parent_hash`, making it
  // findable by later prefixes. Returns its hash.
  uint64_t commit_full(int block, uint64_t parent_hash, const int32_t* tokens);
  // Makes every cached block unfindable (after a failure that leaves their contents in doubt);
  // unreferenced ones become free.
  void forget_cached();

  int64_t num_prefix_queries() const { return num_queries_; }
  int64_t num_prefix_hit_blocks() const { return num_hits_; }

  static uint64_t chain_hash(uint64_t parent, const int32_t* tokens, int n);

 private:
  struct Block {
    int ref = 0;
    uint64_t hash = 0;  // 0: not cached
    std::vector<int32_t> tokens;
    std::list<int>::iterator lru_pos;
    bool in_lru = false;
  };
  void uncache(int id);

  int block_size_;
  std::vector<Block> blocks_;
  std::vector<int> free_;                      // never-cached or evicted, ref 0
  std::list<int> lru_;                         // cached, ref 0; front = least recently used
  std::unordered_map<uint64_t, int> by_hash_;  // cached blocks
  int64_t num_queries_ = 0;
  int64_t num_hits_ = 0;
};

}  // namespace hr::engine
