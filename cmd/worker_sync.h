// The in-process worker as the API's sync inference (`serve`): the one place where api/ and
// workers/ meet, so that neither depends on the other.
// Thread-safe, as the Worker is.
#pragma once

#include <memory>

#include "api/sync_inference.h"
#include "workers/worker.h"

namespace hr::cmd {

class WorkerSync final : public api::SyncInference {
 public:
  explicit WorkerSync(workers::Worker& worker) : worker_(worker) {}
  [[nodiscard]] Result<api::SyncAnswer> run(const wire::ChatRequest& request,
                                            const api::SyncCall& call) override;
  [[nodiscard]] Result<std::unique_ptr<wire::AnswerStream>> start_stream(
      const wire::ChatRequest& request, const api::SyncCall& call) override;
  std::vector<queue::WorkerInfo> local_workers() const override;

 private:
  workers::Worker& worker_;
};

}  // namespace hr::cmd
