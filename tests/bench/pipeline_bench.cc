// Pipeline-stage benchmark driver (run by scripts/bench_pipeline.sh), on the CPU backend's ranks.
//   --model DIR [--pp 2] [--tp 1] [--rounds 30]
//       Step times of three engines: the layers split evenly (the reference) and balanced by
//       measured time (engine/stage_balance.h), each step cut into a micro-batch per stage, and
//       the even split with steps never cut; on decode steps of 8 and 32 sequences (after 64
//       cached tokens each) and a prefill of two 256-token prompts. The engines are built once
//       and take turns step by step, so drift in the machine's speed falls on all alike; medians
//       of `rounds` steps each. Then whole answers through the engine (the even split), tokens
//       per second (prompts' and answers'): one group of sequences (each step cut into a
//       micro-batch per stage, the next planned while one runs) against a group per stage in
//       flight (engine/parallel_cpu_backend.h), for 8 and 32 sequences of a 32-token prompt and 32
//       answer tokens, and for 8 prompts of 384 tokens arriving one every 12 steps among 16
//       answers of 96; medians of 3 rounds, the two taking turns.
//   --load DIR [--pp 2] [--tp 1] [--rounds 3]
//       The load's rate against the disk's: the checkpoint's files dropped from the page cache
//       (posix_fadvise DONTNEED; the fraction still resident is reported) before each cold
//       figure: the files read whole (the disk's sequential rate), one rank's load as the
//       loader runs it (read-ahead, a converting thread per core) and serially (neither), the
//       parallel ranks' (each rank reading its shard from the mapping); then both loads again from
//       the page cache (the conversion's own rate). Medians of up to 5 rounds, the figures taking
//       turns in each.
// The last line of output is one JSON object.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "engine/cpu_backend.h"
#include "engine/engine.h"
#include "engine/parallel_cpu_backend.h"
#include "engine/safetensors.h"
#include "engine/synthetic_step.h"
#include "engine/weights.h"
#include "tests/bench/page_cache.h"

using namespace hr::engine;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using hr::bench::checkpoint_files;
using hr::bench::drop_from_page_cache;
using hr::bench::read_whole;

namespace {

double secs(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int load_mode(const std::string& dir, ParallelDegrees degrees, int rounds) {
  const std::vector<std::string> files = checkpoint_files(dir);
  json out = {{"model", dir}, {"tensor_parallel", degrees.tp}, {"pipeline_parallel", degrees.pp}};
  auto config = load_model_config(dir);
  if (!config.is_ok()) return 1;
  size_t bytes = 0;
  {
    auto st = SafetensorsModel::open_dir(dir);  // closed again: mapped pages stay cached
    if (!st.is_ok()) return 1;
    for (const auto& [name, t] : (*st)->tensors()) bytes += t.num_bytes;
  }
  // One rank's load as the worker does it (the files mapped, every tensor converted to fp32,
  // then packed), or with the loader's read-ahead off and one converting thread.
  auto one_rank = [&](bool read_ahead) {
    auto t = Clock::now();
    auto st = SafetensorsModel::open_dir(dir);
    if (!st.is_ok()) std::abort();
    LoadOptions lo;
    lo.threads = read_ahead ? 0 : 1;
    lo.read_ahead_bytes = read_ahead ? LoadOptions().read_ahead_bytes : 0;
    auto w = load_weights_part(**st, *config, {0, config->num_layers, true, true}, lo);
    if (!w.is_ok()) std::abort();
    ModelWeights loaded = std::move(w).value();
    pack_for_cpu(&loaded);
    return secs(t);
  };
  ParallelCpuOptions o;
  o.degrees = degrees;
  auto ranks = [&] {
    auto t = Clock::now();
    auto b = ParallelCpuBackend::create_from_dir(dir, o);
    if (!b.is_ok()) {
      std::fprintf(stderr, "%s\n", b.status().to_string().c_str());
      std::abort();
    }
    return secs(t);
  };
  // Each figure `rounds` times in turn, the files dropped from the page cache before each cold
  // one; the medians.
  std::map<std::string, std::vector<double>> s;
  std::vector<double> resident;
  for (int r = 0; r < rounds; ++r) {
    resident.push_back(drop_from_page_cache(files));
    auto t0 = Clock::now();
    s["disk_read"].push_back(read_whole(files) > 0 ? secs(t0) : 0);
    drop_from_page_cache(files);
    s["one_rank_cold_serial"].push_back(one_rank(false));
    drop_from_page_cache(files);
    s["one_rank_cold"].push_back(one_rank(true));
    drop_from_page_cache(files);
    s["ranks_cold"].push_back(ranks());
    s["one_rank_warm"].push_back(one_rank(true));
    s["ranks_warm"].push_back(ranks());
  }
  out["checkpoint_bytes"] = bytes;
  out["rounds"] = rounds;
  out["resident_after_drop"] = resident;
  const double disk = bytes / median(s["disk_read"]) / 1e9;
  for (const auto& [name, seconds] : s) {
    out["seconds"][name] = seconds;
    out["gbs"][name] = bytes / median(seconds) / 1e9;
  }
  out["disk_cold_read_gbs"] = disk;
  // The goal: a cold load bound by the drive, as fast as reading the files.
  for (const char* name : {"one_rank_cold", "one_rank_cold_serial", "ranks_cold"}) {
    out["over_disk"][name] = out["gbs"][name].get<double>() / disk;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// Requests through an engine, some arriving later: `arrive_every` steps apart.
struct EngineWork {
  int seqs = 0, prompt = 0, answer = 0;
  int late = 0, late_prompt = 0, late_answer = 0, arrive_every = 0;
};

// Tokens per second (prompts' and answers') of the whole run of `w` through an engine on `b`.
double engine_tokens_per_s(std::shared_ptr<Backend> b, const EngineWork& w) {
  EngineOptions eo;
  eo.scheduler.max_num_seqs = w.seqs + w.late;
  eo.scheduler.max_batched_tokens = 2048;
  auto engine = Engine::create(std::move(b), nullptr, 1024, eo);
  if (!engine.is_ok()) std::abort();
  const int V = (*engine)->backend().vocab_size();
  int64_t tokens = 0, added = 0;
  auto add = [&](int prompt, int answer) {
    GenerationRequest r;
    for (int k = 0; k < prompt; ++k) r.prompt.push_back((added * 131 + k * 71 + 5) % V);
    r.params.max_tokens = answer;
    r.params.ignore_eos = true;
    r.on_event = [&tokens](const TokenEvent& ev) { tokens += ev.token >= 0; };
    if (!(*engine)->add(std::move(r)).is_ok()) std::abort();
    tokens += prompt;
    ++added;
  };
  for (int i = 0; i < w.seqs; ++i) add(w.prompt, w.answer);
  const auto t = Clock::now();
  int late = 0;
  for (int64_t step = 1; (*engine)->has_work() || late < w.late; ++step) {
    if (late < w.late && step % w.arrive_every == 0) {
      add(w.late_prompt, w.late_answer);
      ++late;
    }
    if (!(*engine)->step().is_ok()) std::abort();
  }
  return static_cast<double>(tokens) / secs(t);
}

struct Config {
  std::string name;
  bool balance;
  int micro_batches;  // 0: one per stage
};

// A kind of step, made up (engine/synthetic_step.h): `seqs` sequences of `count` new tokens
// after `context` cached ones.
struct Workload {
  std::string name;
  int seqs, context, count;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model, load;
  ParallelDegrees d{1, 2, 1};
  int rounds = 0;  // 0: 30 steps a figure, 3 rounds of loads
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--model") model = argv[i + 1];
    if (k == "--load") load = argv[i + 1];
    if (k == "--pp") d.pp = std::atoi(argv[i + 1]);
    if (k == "--tp") d.tp = std::atoi(argv[i + 1]);
    if (k == "--rounds") rounds = std::atoi(argv[i + 1]);
  }
  if (!load.empty()) return load_mode(load, d, rounds > 0 ? std::min(rounds, 5) : 3);
  if (rounds <= 0) rounds = 30;
  auto w = load_weights(model);
  if (!w.is_ok()) {
    std::fprintf(stderr, "%s\n", w.status().to_string().c_str());
    return 1;
  }
  const ModelWeights full = std::move(w).value();
  const int V = full.config.vocab_size;
  // The first is the reference: the layers split evenly, every step cut into a micro-batch per
  // stage.
  const std::vector<Config> configs = {
      {"even", false, 0}, {"balanced", true, 0}, {"even_one_micro_batch", false, 1}};
  const std::vector<Workload> workloads = {
      {"decode_batch8", 8, 64, 1}, {"decode_batch32", 32, 64, 1}, {"prefill_2x256", 2, 0, 256}};
  std::vector<std::shared_ptr<ParallelCpuBackend>> backends;
  json layers = json::object(), balance = json::object();
  for (const Config& c : configs) {
    ParallelCpuOptions o;
    o.degrees = d;
    o.kv_cache_bytes = 512ull << 20;
    o.micro_batches = c.micro_batches;
    o.balance_stages = c.balance;
    auto made = ParallelCpuBackend::create(full, o);
    if (!made.is_ok()) {
      std::fprintf(stderr, "%s\n", made.status().to_string().c_str());
      return 1;
    }
    backends.emplace_back(std::move(made).value());
    const ParallelCpuBackend& b = *backends.back();
    layers[c.name] = b.stage_layers();
    if (b.stage_balance().ran) {
      const StageBalance& s = b.stage_balance();
      auto ms = [](const std::vector<double>& v) {
        json a = json::array();
        for (double x : v) a.push_back(x * 1e3);
        return a;
      };
      balance[c.name] = {{"stage_ms_before", ms(s.seconds_before)},
                         {"stage_ms_predicted", ms(s.predicted_after)},
                         {"calibration_seconds", s.calibration_seconds}};
    }
  }
  // Each workload's steps, the configurations taking turns step by step so that drift in the
  // machine's speed falls on all of them alike.
  json medians = json::object(), over = json::object();
  for (const Workload& w : workloads) {
    const int per_seq = SyntheticStep::blocks_for(w.context + w.count - 1, 16);
    std::vector<float> logits(static_cast<size_t>(w.seqs) * V);
    if (w.context > 0) {
      const SyntheticStep fill(w.seqs, 0, w.context, per_seq, V);
      for (auto& b : backends) {
        if (!b->forward(fill.input(), logits.data()).is_ok()) return 1;
      }
    }
    const SyntheticStep step(w.seqs, w.context, w.count, per_seq, V);
    std::vector<std::vector<double>> ms(backends.size());
    for (int round = 0; round < rounds + 2; ++round) {
      for (size_t i = 0; i < backends.size(); ++i) {
        auto t = Clock::now();
        if (!backends[i]->forward(step.input(), logits.data()).is_ok()) return 1;
        if (round >= 2) ms[i].push_back(secs(t) * 1e3);  // two warm-up rounds
      }
    }
    json line = {{"workload", w.name}};
    for (size_t i = 0; i < backends.size(); ++i) {
      medians[w.name][configs[i].name] = median(ms[i]);
      line[configs[i].name + "_ms"] = median(ms[i]);
    }
    // Speed-ups: the reference's step time over each other's.
    for (size_t i = 1; i < backends.size(); ++i) {
      over[w.name][configs[i].name] = median(ms[0]) / median(ms[i]);
    }
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  // Whole answers through the engine: one group against a group per stage.
  json engine_tok_s = json::object(), groups_over_one = json::object();
  // Answers of 32 tokens after prompts of 32, for 8 and 32 sequences; and long prompts (384
  // tokens, answers of 8) arriving one at a time among 16 answers of 96 tokens.
  const std::vector<std::pair<std::string, EngineWork>> works = {
      {"batch8", {8, 32, 32}},
      {"batch32", {32, 32, 32}},
      {"long_prompts", {16, 32, 96, 8, 384, 8, 12}}};
  for (const auto& [name, work] : works) {
    std::map<int, std::vector<double>> tok_s;  // groups -> rounds
    for (int round = 0; round < 3; ++round) {
      for (int groups : {1, d.pp}) {
        ParallelCpuOptions o;
        o.degrees = d;
        o.kv_cache_bytes = 512ull << 20;
        o.step_groups = groups;
        o.pipelined = groups == 1;  // (one group: the next step planned while one runs)
        auto made = ParallelCpuBackend::create(full, o);
        if (!made.is_ok()) return 1;
        tok_s[groups].push_back(
            engine_tokens_per_s(std::shared_ptr<Backend>(std::move(made).value()), work));
      }
    }
    engine_tok_s[name] = {{"one_group", median(tok_s[1])},
                          {"group_per_stage", median(tok_s[d.pp])}};
    groups_over_one[name] = median(tok_s[d.pp]) / median(tok_s[1]);
    std::printf("%s\n", json({{"engine", name}, {"tok_s", engine_tok_s[name]}}).dump().c_str());
    std::fflush(stdout);
  }
  json out = {{"model", model},
              {"tensor_parallel", d.tp},
              {"pipeline_parallel", d.pp},
              {"rounds", rounds},
              {"stage_layers", layers},
              {"balance", balance},
              {"step_ms", medians},
              {"speedup_over_even", over},
              {"engine_tok_s", engine_tok_s},
              {"groups_over_one_group", groups_over_one}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
