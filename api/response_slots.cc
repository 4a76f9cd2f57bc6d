#include "api/response_slots.h"

namespace hr::api {

std::shared_ptr<void> ResponseSlots::take(const std::string& account) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    int& n = held_[account];
    if (n >= per_account_) {
      if (n == 0) held_.erase(account);
      return nullptr;
    }
    ++n;
  }
  // Answers in flight end before the API that owns the slots is destroyed (the server drains
  // them first), so the handle may point at the slots.
  return std::shared_ptr<void>(static_cast<void*>(this),
                               [this, account](void*) { give_back(account); });
}

int ResponseSlots::held(const std::string& account) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(account);
  return it == held_.end() ? 0 : it->second;
}

void ResponseSlots::give_back(const std::string& account) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(account);
  if (it == held_.end()) return;
  if (--it->second <= 0) held_.erase(it);
}

}  // namespace hr::api
