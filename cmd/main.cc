// headroom: one binary, several roles. Parses the command line (flags > HEADROOM_* environment >
// config file), sets up logging and runs the chosen subcommand.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>

#include "base/cli.h"
#include "base/log.h"
#include "cmd/accounts.h"
#include "cmd/batch_cli.h"
#include "cmd/plan.h"
#include "cmd/roles.h"
#include "engine/device.h"
#include "queue/config.h"
#include "queue/migrate.h"
#include "workers/worker_config.h"

namespace {

struct GlobalConfig {
  std::string config_file;
  std::string log_level = "info";
  std::string log_format = "text";
};

struct MigrateCommand {
  hr::queue::StoreConfig store;
  std::string migrations_dir;
};

int run_migrate(const MigrateCommand& cmd) {
  std::vector<hr::queue::Migration> files;
  if (cmd.migrations_dir.empty()) {
    files = hr::queue::bundled_migrations();
  } else {
    auto loaded = hr::queue::load_migrations_dir(cmd.migrations_dir);
    if (!loaded.is_ok()) {
      hr::log::error("migrate.failed", {{"error", loaded.status()}});
      return 1;
    }
    files = std::move(loaded).value();
  }
  auto report = hr::queue::migrate(cmd.store.database_url, files);
  if (!report.is_ok()) {
    hr::log::error("migrate.failed", {{"error", report.status()}});
    return 1;
  }
  hr::log::info("migrate.done", {{"applied", static_cast<int64_t>(report->applied.size())},
                                 {"already_applied", report->num_already_applied}});
  return 0;
}

// The retention flags of the processes that run the dispatcher's duties.
void bind_retention(CLI::App& app, hr::queue::DispatcherOptions& d) {
  hr::cli::add(app, "--partition-interval-s", d.retention.partition_seconds,
               "Requests of the batches created in this many seconds share a partition, dropped "
               "whole once all of them expired");
  hr::cli::add(app, "--purge-interval-ms", d.purge_interval_ms,
               "How often expired and deleted batches and files are purged (0: never)");
}

// The relay's flags (docs/fair-share.md).
void bind_relay(CLI::App& app, hr::queue::DispatcherOptions& d) {
  hr::cli::add(app, "--queue-window-ms", d.window.window_ms,
               "Each model's ready-queue holds about this many milliseconds of what the workers "
               "take; the rest waits in Postgres, shared fairly among accounts");
  hr::cli::add(app, "--queue-window-min", d.window.min_entries,
               "The least requests each model's ready-queue holds");
  hr::cli::add(app, "--queue-window-max", d.window.max_entries,
               "The most requests each model's ready-queue holds");
  hr::cli::add(app, "--fair-share", d.fair_share,
               "Share each model's queue among accounts (false: first in, first out, every "
               "request pushed at once, for comparisons)");
  hr::cli::add(app, "--catch-up", d.catch_up_below,
               "An account with less than this fraction of another's work in flight per weight "
               "(a newcomer) has its share started at once, ahead of others' running work (0: "
               "never)")
      ->check(CLI::Range(0.0, 1.0));
  hr::cli::add(app, "--dispatch-by-prefix", d.dispatch_by_prefix,
               "Send queued requests whose prompts start alike to the same worker, whose prefix "
               "cache then computes that start once (docs/cache-aware-dispatch.md)");
}

int run_version() {
  std::printf("headroom %s\n", HEADROOM_VERSION);
  std::printf("cuda backend: %s\n", hr::engine::cuda_compiled() ? "compiled" : "not compiled");
  for (const auto& gpu : hr::engine::list_gpus()) {
    std::printf("gpu %d: %s (sm_%d%d, %zu MiB)\n", gpu.index, gpu.name.c_str(), gpu.compute_major,
                gpu.compute_minor, gpu.total_memory_bytes >> 20);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Headroom: asynchronous (flex) LLM inference", "headroom"};
  app.require_subcommand(1);
  GlobalConfig global;
  hr::cli::add(app, "--config", global.config_file,
               "Config file of key = value lines, [subcommand] sections allowed");
  hr::cli::add(app, "--log-level", global.log_level, "debug, info, warn or error");
  hr::cli::add(app, "--log-format", global.log_format, "text (key=value) or json");

  MigrateCommand migrate;
  CLI::App* migrate_cmd = app.add_subcommand("migrate", "Apply database migrations in order");
  migrate.store.bind(*migrate_cmd, /*with_redis=*/false);
  hr::cli::add(*migrate_cmd, "--migrations-dir", migrate.migrations_dir,
               "Read NNNN_name.sql files from this folder instead of the built-in ones");

  CLI::App* version_cmd = app.add_subcommand("version", "Print the version and the devices");

  hr::cmd::ServeConfig serve;
  CLI::App* serve_cmd =
      app.add_subcommand("serve", "API + worker + dispatcher in one process for one machine");
  serve.store.bind(*serve_cmd);
  serve.api.webhook_allow = {"loopback"};  // one machine: local receivers are the common case
  serve.api.bind(*serve_cmd);
  serve.webhooks.bind(*serve_cmd, /*with_allow=*/false);
  serve.worker.bind(*serve_cmd);
  bind_retention(*serve_cmd, serve.dispatcher);
  bind_relay(*serve_cmd, serve.dispatcher);
  hr::cli::add(*serve_cmd, "--api-key", serve.api_key,
               "Key for the default account (HEADROOM_API_KEY); a new one is printed when unset");
  hr::cli::add(*serve_cmd, "--account", serve.account, "Name of the default account");

  hr::queue::StoreConfig api_store;
  hr::api::ApiConfig api_config;
  CLI::App* api_cmd = app.add_subcommand("api", "Stateless HTTP front");
  api_store.bind(*api_cmd);
  api_config.bind(*api_cmd);

  hr::queue::StoreConfig worker_store;
  hr::workers::WorkerConfig worker;
  CLI::App* worker_cmd = app.add_subcommand("worker", "Host one engine instance");
  worker_store.bind(*worker_cmd);
  worker.bind(*worker_cmd);
  hr::workers::SyncServerOptions worker_sync;
  worker_sync.bind(*worker_cmd);
  int worker_metrics_port = 0;
  hr::cli::add(*worker_cmd, "--metrics-port", worker_metrics_port,
               "Serve GET /metrics (Prometheus text) on this port; 0: off");

  hr::queue::StoreConfig dispatcher_store;
  hr::queue::DispatcherOptions dispatcher;
  CLI::App* dispatcher_cmd =
      app.add_subcommand("dispatcher", "Postgres→Redis relay, lease janitor, webhook delivery");
  dispatcher_store.bind(*dispatcher_cmd);
  hr::cli::add(*dispatcher_cmd, "--dispatcher-name", dispatcher.name,
               "Name used when reclaiming stream entries");
  hr::cli::add(*dispatcher_cmd, "--max-attempts", dispatcher.max_attempts,
               "Failed attempts (errors worth retrying, expired leases) before a request ends "
               "failed; give the workers the same");
  hr::cli::add(*dispatcher_cmd, "--reclaim-idle-ms", dispatcher.reclaim_idle_ms,
               "Pending stream entries idle this long are reclaimed");
  bind_retention(*dispatcher_cmd, dispatcher);
  bind_relay(*dispatcher_cmd, dispatcher);
  hr::webhooks::DeliveryOptions dispatcher_webhooks;
  dispatcher_webhooks.bind(*dispatcher_cmd, /*with_allow=*/true);

  // One StoreConfig per subcommand: two options bound to one variable let the environment of the
  // subcommand not run overwrite the flag of the one that runs.
  hr::queue::StoreConfig accounts_show_store;
  hr::queue::StoreConfig accounts_set_store;
  std::string accounts_name;
  std::optional<double> accounts_retention;
  std::optional<int64_t> accounts_max_enqueued;
  std::optional<int64_t> accounts_max_enqueued_tokens;
  std::optional<double> accounts_weight;
  hr::queue::SyncLimits accounts_sync;
  std::optional<int> accounts_priority;
  std::optional<bool> accounts_operator;
  CLI::App* accounts_cmd = app.add_subcommand("accounts", "Show and set accounts' defaults");
  accounts_cmd->require_subcommand(1);
  CLI::App* accounts_show =
      accounts_cmd->add_subcommand("show", "Print an account's settings and what it holds");
  accounts_show_store.bind(*accounts_show, /*with_redis=*/false);
  accounts_show->add_option("--account", accounts_name, "Account name")->required();
  CLI::App* accounts_set = accounts_cmd->add_subcommand("set", "Set an account's defaults");
  accounts_set_store.bind(*accounts_set, /*with_redis=*/false);
  accounts_set->add_option("--account", accounts_name, "Account name")->required();
  accounts_set->add_option("--retention-days", accounts_retention,
                           "Its batches and files are kept this long unless a request says (0: "
                           "the server's --retention-days)");
  accounts_set->add_option("--max-enqueued-requests", accounts_max_enqueued,
                           "The most of its requests queued or running at once; a submit past "
                           "it gets 429 (0: no limit)");
  accounts_set->add_option("--max-enqueued-tokens", accounts_max_enqueued_tokens,
                           "The most tokens its queued and running requests may hold (each: "
                           "prompt bytes / 4 and max_tokens); a submit past it gets 429 (0: no "
                           "limit)");
  accounts_set->add_option("--sync-requests-per-minute", accounts_sync.requests_per_minute,
                           "Its sync calls a minute, over every API process (0: no limit)");
  accounts_set->add_option("--sync-tokens-per-minute", accounts_sync.tokens_per_minute,
                           "Its sync calls' tokens a minute: prompt and max_tokens at admission, "
                           "settled to the real count (0: no limit)");
  accounts_set->add_option("--max-concurrent-sync", accounts_sync.concurrent,
                           "Its sync calls in progress at once (0: no limit)");
  accounts_set->add_option("--weight", accounts_weight,
                           "Its share of each model's queue against other accounts with work "
                           "waiting (default 1; 2 gets twice as much)");
  accounts_set->add_option("--default-priority", accounts_priority,
                           "The priority of its batches that name none (-100 to 100, default 0); "
                           "a priority orders the account's own batches only");
  accounts_set->add_option("--operator", accounts_operator,
                           "Whether its keys may read the whole deployment's load (true/false): "
                           "the dashboard's operator view, GET /v1/operator/stats");

  hr::queue::StoreConfig keys_create_store;
  hr::queue::StoreConfig keys_revoke_store;
  std::string key_account;
  CLI::App* keys_cmd = app.add_subcommand("keys", "Manage API keys");
  keys_cmd->require_subcommand(1);
  CLI::App* keys_create = keys_cmd->add_subcommand("create", "Create a key and print it once");
  keys_create_store.bind(*keys_create, /*with_redis=*/false);
  keys_create->add_option("--account", key_account, "Account name (created if new)")->required();
  std::string revoke_key;
  CLI::App* keys_revoke = keys_cmd->add_subcommand(
      "revoke", "Revoke a key, or every key of an account, at once in every API process");
  keys_revoke_store.bind(*keys_revoke, /*with_redis=*/false);
  auto* revoke_key_opt =
      keys_revoke->add_option("--key", revoke_key, "The key to revoke (HEADROOM_REVOKE_KEY)")
          ->envname("HEADROOM_REVOKE_KEY");
  auto* revoke_account_opt =
      keys_revoke->add_option("--account", key_account, "Revoke every key of this account");
  revoke_key_opt->excludes(revoke_account_opt);

  hr::cmd::BatchCommand batch;
  CLI::App* batch_cmd = app.add_subcommand(
      "batch", "Submit and watch batches, see and cancel them, fetch results (over the HTTP API)");
  batch_cmd->require_subcommand(1);
  // --url and --api-key may also follow the subcommand (`headroom batch list --url U`).
  batch_cmd->fallthrough();
  batch.url = "http://127.0.0.1:8080";
  hr::cli::add(*batch_cmd, "--url", batch.url, "The API's base URL");
  hr::cli::add(*batch_cmd, "--api-key", batch.api_key, "An API key of the account");
  CLI::App* batch_submit = batch_cmd->add_subcommand(
      "submit", "Submit a JSONL file: Workers-AI request objects, or OpenAI batch lines");
  batch_submit->add_option("FILE", batch.file, "The JSONL file")->required();
  batch_submit->add_option("--model", batch.model, "The model (Workers-AI shape)");
  batch_submit->add_option("--shape", batch.shape,
                           "workers-ai or openai (default: from the first line)");
  batch_submit->add_option("--webhook-url", batch.webhook_url, "Where to post its events");
  batch_submit->add_option("--completion-window", batch.completion_window,
                           "Its deadline, as 24h, 90m (default: the server's)");
  batch_submit->add_flag("--wait", batch.wait,
                         "Watch it to the end: a live progress line; exit 0, 2 or 3 by outcome");
  CLI::App* batch_status = batch_cmd->add_subcommand("status", "A batch's status and progress");
  batch_status->add_option("ID", batch.id, "The batch's id")->required();
  batch_status->add_flag("--wait", batch.wait, "Watch it to the end");
  CLI::App* batch_list = batch_cmd->add_subcommand("list", "The account's latest batches");
  batch_list->add_option("--limit", batch.limit, "How many (1 to 100)");
  CLI::App* batch_cancel = batch_cmd->add_subcommand("cancel", "Cancel a batch");
  batch_cancel->add_option("ID", batch.id, "The batch's id")->required();
  CLI::App* batch_retry = batch_cmd->add_subcommand(
      "retry", "A new batch of a finished one's failed, expired and cancelled requests");
  batch_retry->add_option("ID", batch.id, "The batch's id")->required();
  CLI::App* batch_results = batch_cmd->add_subcommand(
      "results", "Its results so far, one JSON line each, in input order");
  batch_results->add_option("ID", batch.id, "The batch's id")->required();
  batch_results->add_option("-o,--output", batch.output, "Write them to this file");
  batch_results->add_flag("--resume", batch.resume,
                          "Continue FILE from its last whole line instead of starting over");

  hr::cmd::PlanCommand plan;
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "Each device's memory for a model and parallel layout, and the KV cache it leaves");
  hr::cli::add(*plan_cmd, "--model", plan.model, "A model folder or its config.json")->required();
  hr::cli::add(*plan_cmd, "--devices", plan.devices,
               "Devices in all (tp × pp; alone: all tensor-parallel)");
  hr::cli::add(*plan_cmd, "--gpu-memory", plan.gpu_memory, "Each device's memory (80GiB, 141GB)");
  hr::cli::add(*plan_cmd, "--tp", plan.options.tp, "Tensor-parallel ranks per stage");
  hr::cli::add(*plan_cmd, "--pp", plan.options.pp, "Pipeline stages");
  hr::cli::add(*plan_cmd, "--stage-layers", plan.stage_layers,
               "Each pipeline stage's layers, first to last (30,34), or even: as even as they go");
  hr::cli::add(*plan_cmd, "--ep", plan.options.ep,
               "Expert parallelism: 1 (each expert sliced over the tp ranks) or --tp (experts "
               "sharded whole)");
  hr::cli::add(*plan_cmd, "--weights", plan.weights,
               "The dense matrices on the device: bf16 (what the engine holds), fp8 or int4");
  hr::cli::add(*plan_cmd, "--expert-weights", plan.expert_weights,
               "The routed experts' matrices (default: as --weights)");
  hr::cli::add(*plan_cmd, "--max-batched-tokens", plan.options.max_num_tokens, "Tokens per step");
  hr::cli::add(*plan_cmd, "--max-num-seqs", plan.options.max_num_seqs, "Sequences per step");
  hr::cli::add(*plan_cmd, "--block-size", plan.options.block_size, "Tokens per KV block");
  hr::cli::add(*plan_cmd, "--sms", plan.options.num_sms, "Streaming multiprocessors per device");
  hr::cli::add(*plan_cmd, "--kv-cache-fraction", plan.options.kv_cache_fraction,
               "Of the memory free once weights and buffers are in place");
  hr::cli::add_flag(*plan_cmd, "--json", plan.json, "Print JSON");

  CLI11_PARSE(app, argc, argv);

  if (!global.config_file.empty()) {
    auto file = hr::cli::read_config_file(global.config_file);
    hr::Status st = file.is_ok() ? hr::cli::apply_config_file(app, *file) : file.status();
    if (!st.is_ok()) {
      std::fprintf(stderr, "headroom: %s\n", st.to_string().c_str());
      return 2;
    }
  }
  auto level = hr::log::parse_level(global.log_level);
  auto format = hr::log::parse_format(global.log_format);
  if (!level.is_ok() || !format.is_ok()) {
    std::fprintf(stderr, "headroom: %s\n",
                 (!level.is_ok() ? level.status() : format.status()).to_string().c_str());
    return 2;
  }
  hr::log::set_level(*level);
  hr::log::set_format(*format);

  auto validate = [](const hr::Status& st) {
    if (st.is_ok()) return true;
    std::fprintf(stderr, "headroom: %s\n", st.to_string().c_str());
    return false;
  };
  if (migrate_cmd->parsed()) {
    return validate(migrate.store.validate()) ? run_migrate(migrate) : 2;
  }
  if (version_cmd->parsed()) return run_version();
  if (plan_cmd->parsed()) return hr::cmd::run_plan(plan);
  if (batch_cmd->parsed()) {
    for (CLI::App* sub :
         {batch_submit, batch_status, batch_list, batch_cancel, batch_retry, batch_results}) {
      if (sub->parsed()) batch.action = sub->get_name();
    }
    return hr::cmd::run_batch(batch);
  }
  if (serve_cmd->parsed()) {
    if (!validate(serve.store.validate()) || !validate(serve.api.validate()) ||
        !validate(serve.worker.validate()) || !validate(serve.webhooks.validate())) {
      return 2;
    }
    serve.dispatcher.max_attempts = serve.worker.max_attempts;  // one limit for both
    return hr::cmd::run_serve(serve);
  }
  if (api_cmd->parsed()) {
    if (!validate(api_store.validate()) || !validate(api_config.validate())) return 2;
    return hr::cmd::run_api(api_config, api_store);
  }
  if (worker_cmd->parsed()) {
    if (!validate(worker_store.validate()) || !validate(worker.validate()) ||
        !validate(worker_sync.validate())) {
      return 2;
    }
    return hr::cmd::run_worker(worker, worker_store, worker_sync, worker_metrics_port);
  }
  if (dispatcher_cmd->parsed()) {
    if (!validate(dispatcher_store.validate()) || !validate(dispatcher_webhooks.validate()))
      return 2;
    return hr::cmd::run_dispatcher(dispatcher_store, dispatcher, dispatcher_webhooks);
  }
  if (accounts_show->parsed() || accounts_set->parsed()) {
    const hr::queue::StoreConfig& store =
        accounts_show->parsed() ? accounts_show_store : accounts_set_store;
    if (!validate(store.validate())) return 2;
    return accounts_show->parsed()
               ? hr::cmd::run_accounts_show(store, accounts_name)
               : hr::cmd::run_accounts_set(
                     store, accounts_name,
                     {accounts_retention, accounts_max_enqueued, accounts_max_enqueued_tokens,
                      accounts_weight, accounts_priority, accounts_sync, accounts_operator});
  }
  if (keys_create->parsed()) {
    return validate(keys_create_store.validate())
               ? hr::cmd::run_keys_create(keys_create_store, key_account)
               : 2;
  }
  if (keys_revoke->parsed()) {
    if (revoke_key.empty() && key_account.empty()) {
      std::fprintf(stderr, "headroom: keys revoke: name --key or --account\n");
      return 2;
    }
    return validate(keys_revoke_store.validate())
               ? hr::cmd::run_keys_revoke(keys_revoke_store, revoke_key, key_account)
               : 2;
  }
  return 2;
}
