#include "core/deferred_work.h"

namespace fp8tron {

void DeferredWork::hold(std::function<void()> work, std::vector<Key> params) {
  std::lock_guard<std::mutex> lock(mutex_);
  items_.push_back({std::move(work), std::move(params)});
  ++held_;
}

int64_t DeferredWork::run() {
  int64_t count = 0;
  for (;;) {
    std::vector<Item> items;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items.swap(items_);
    }
    if (items.empty()) break;
    // Outside the lock: a closure may hold more work (it runs in the next round).
    for (auto& item : items) {
      item.work();
      if (on_done_)
        for (Key p : item.params) on_done_(p);
      ++count;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ran_ += count;
  return count;
}

bool DeferredWork::empty() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return items_.empty();
}

int64_t DeferredWork::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_;
}

int64_t DeferredWork::ran() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ran_;
}

}  // namespace fp8tron
