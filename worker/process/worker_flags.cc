// ParseWorkerFlags (worker_process.h): `deltaserve worker` flags -> WorkerOptions, every value
// checked here so that a bad flag is reported before the model is opened.
#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config/config_file.h"
#include "common/util/model_alias.h"
#include "worker/model/kv_type.h"
#include "worker/process/worker_process.h"

namespace ds {

absl::StatusOr<WorkerOptions> ParseWorkerFlags(int argc, char** argv) {
  std::set<std::string> known = {
      "--scheduler", "--model", "--backend", "--worker-id", "--threads", "--device",
      "--connect-timeout", "--nvml-device", "--port-file", "--tp-rank", "--tp-world", "--tp-group",
      "--split", "--tp-iface", "--tp-addr", "--tp-collective", "--scheduler-key-file",
      "--scheduler-ca", "--scheduler-tls-name", "--kv-type", "--kv-pool-tokens", "--kv-page",
      "--memory-fraction", "--max-step-tokens", "--mtp", "--mtp-seqs", "--max-active",
      "--prefix-cache", "--prefix-cache-mb", "--prefix-cache-tier"};
  known.insert(DeviceTuningFlagNames().begin(), DeviceTuningFlagNames().end());
  DS_ASSIGN_OR_RETURN(auto m, config::ParseFlagPairs(argc, argv, known));
  WorkerOptions o;
  if (!m.count("--scheduler")) return absl::InvalidArgumentError("--scheduler HOST:PORT is required");
  if (!m.count("--model")) return absl::InvalidArgumentError("--model FILE is required");
  o.scheduler = m["--scheduler"];
  o.model = ResolveModelAlias(m["--model"]);  // "demo": models/demo/
  if (m.count("--backend")) o.backend = m["--backend"];
  if (m.count("--worker-id")) {
    o.worker_id = m["--worker-id"];
  } else {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    o.worker_id = absl::StrCat(host, ":", getpid());
  }
  auto num = [&](const char* f, double* v) -> absl::Status {
    if (m.count(f) && !absl::SimpleAtod(m[f], v))
      return absl::InvalidArgumentError(absl::StrCat(f, " expects a number, got '", m[f], "'"));
    return absl::OkStatus();
  };
  double threads = 0, device = 0;
  DS_RETURN_IF_ERROR(num("--threads", &threads));
  DS_RETURN_IF_ERROR(num("--device", &device));
  DS_RETURN_IF_ERROR(num("--connect-timeout", &o.connect_timeout_s));
  o.threads = static_cast<int>(threads);
  o.device = static_cast<int>(device);
  double pool_tokens = 0, page = 0, step_tokens = 0;
  DS_RETURN_IF_ERROR(num("--max-step-tokens", &step_tokens));
  if (step_tokens < 0 || step_tokens > (1 << 20))
    return absl::InvalidArgumentError(absl::StrCat("--max-step-tokens ", step_tokens,
                                                   " must be in [0, 1048576]"));
  o.max_step_tokens = static_cast<int>(step_tokens);
  DS_RETURN_IF_ERROR(num("--kv-pool-tokens", &pool_tokens));
  DS_RETURN_IF_ERROR(num("--kv-page", &page));
  DS_RETURN_IF_ERROR(num("--memory-fraction", &o.memory_fraction));
  if (pool_tokens < 0 || page < 0 || o.memory_fraction <= 0 || o.memory_fraction > 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-pool-tokens ", pool_tokens, " / --kv-page ", page, " must be >= 0 and ",
        "--memory-fraction ", o.memory_fraction, " in (0, 1]"));
  o.kv_pool_tokens = static_cast<int64_t>(pool_tokens);
  o.kv_page_size = static_cast<int>(page);
  if (m.count("--port-file")) o.port_file = m["--port-file"];
  if (m.count("--mtp")) {
    DS_ASSIGN_OR_RETURN(o.mtp, spec::ParseMtpSetting(m["--mtp"]));
  }
  double mtp_seqs = o.mtp_seqs;
  DS_RETURN_IF_ERROR(num("--mtp-seqs", &mtp_seqs));
  if (mtp_seqs < 1 || mtp_seqs > 256)
    return absl::InvalidArgumentError(absl::StrCat("--mtp-seqs ", mtp_seqs, " must be in [1, 256]"));
  o.mtp_seqs = static_cast<int>(mtp_seqs);
  double max_active = 0;
  DS_RETURN_IF_ERROR(num("--max-active", &max_active));
  if (max_active < 0 || max_active > 4096)
    return absl::InvalidArgumentError(
        absl::StrCat("--max-active ", max_active, " must be in [0, 4096] (0 = every slot)"));
  o.max_active = static_cast<int>(max_active);
  if (m.count("--prefix-cache")) {
    if (m["--prefix-cache"] != "on" && m["--prefix-cache"] != "off")
      return absl::InvalidArgumentError("--prefix-cache expects on or off, got '" +
                                        m["--prefix-cache"] + "'");
    if (m["--prefix-cache"] == "off") o.prefix_cache_mb = 0;
  }
  if (m.count("--prefix-cache-mb")) {
    uint64_t mb = 0;
    if (!absl::SimpleAtoi(m["--prefix-cache-mb"], &mb) || mb > (uint64_t{1} << 24))
      return absl::InvalidArgumentError("--prefix-cache-mb expects MiB in [0, 16777216], got '" +
                                        m["--prefix-cache-mb"] + "'");
    if (!m.count("--prefix-cache") || m["--prefix-cache"] == "on") o.prefix_cache_mb = mb;
  }
  if (m.count("--prefix-cache-tier")) {
    o.prefix_cache_tier = m["--prefix-cache-tier"];
    if (o.prefix_cache_tier != "auto" && o.prefix_cache_tier != "host" &&
        o.prefix_cache_tier != "device")
      return absl::InvalidArgumentError("--prefix-cache-tier expects auto, host or device, got '" +
                                        o.prefix_cache_tier + "'");
  }
  DS_RETURN_IF_ERROR(ParseDeviceTuning(m, &o.tuning));
  if (m.count("--kv-type")) {
    DS_ASSIGN_OR_RETURN(o.kv_type, ParseKvType(m["--kv-type"]));
    if (o.kv_type != GgmlType::F16 && o.backend == "cpu")
      return absl::InvalidArgumentError(
          "--kv-type " + m["--kv-type"] +
          " needs --backend cuda: the CPU backend keeps its KV cache in f32 (only f16, the "
          "default, is accepted there)");
  }
  if (m.count("--tp-rank") && !absl::SimpleAtoi(m["--tp-rank"], &o.tp_rank))
    return absl::InvalidArgumentError("--tp-rank expects an integer, got '" + m["--tp-rank"] + "'");
  if (m.count("--tp-world") && !absl::SimpleAtoi(m["--tp-world"], &o.tp_world))
    return absl::InvalidArgumentError("--tp-world expects an integer, got '" + m["--tp-world"] + "'");
  if (o.tp_world < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp_world)
    return absl::InvalidArgumentError(
        absl::StrCat("--tp-rank ", o.tp_rank, " is not in a --tp-world of ", o.tp_world));
  if (m.count("--tp-group")) o.tp_group = m["--tp-group"];
  if (m.count("--split")) o.tp_split = m["--split"];
  if (m.count("--tp-iface")) o.tp_iface = m["--tp-iface"];
  if (m.count("--tp-addr")) o.tp_addr = m["--tp-addr"];
  if (!o.tp_iface.empty() && !o.tp_addr.empty())
    return absl::InvalidArgumentError("give --tp-iface or --tp-addr, not both");
  if (m.count("--scheduler-key-file")) o.scheduler_key_file = m["--scheduler-key-file"];
  if (m.count("--scheduler-ca")) o.scheduler_ca = m["--scheduler-ca"];
  if (m.count("--scheduler-tls-name")) o.scheduler_tls_name = m["--scheduler-tls-name"];
  if (m.count("--tp-collective")) o.tp_collective = m["--tp-collective"];
  if (o.tp_collective != "auto" && o.tp_collective != "gloo" && o.tp_collective != "nccl" &&
      o.tp_collective != "custom")
    return absl::InvalidArgumentError("--tp-collective expects auto, gloo, nccl or custom, got '" +
                                      o.tp_collective + "'");
  if (o.tp_collective == "custom" && o.backend == "cpu")
    return absl::InvalidArgumentError("--tp-collective custom needs --backend cuda");
  if (o.tp_collective == "nccl" && o.backend == "cpu")
    return absl::InvalidArgumentError("--tp-collective nccl needs --backend cuda");
  if (m.count("--nvml-device")) {
    if (m["--nvml-device"] == "off") {
      o.nvml_device = -2;
    } else if (!absl::SimpleAtoi(m["--nvml-device"], &o.nvml_device) || o.nvml_device < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nvml-device expects a GPU index >= 0 or 'off', got '", m["--nvml-device"], "'"));
    }
  }
  return o;
}

}  // namespace ds
