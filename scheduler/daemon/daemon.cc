#include "scheduler/daemon/daemon.h"

#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/auth/bearer.h"
#include "common/auth/listener.h"
#include "common/auth/tls.h"
#include "common/config/config_file.h"
#include "common/config/role.h"
#include "common/log/log.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/scheduler_metrics.h"
#include "common/systemd/notify.h"
#include "common/systemd/watchdog.h"
#include "scheduler/daemon/cluster_service.h"

namespace ds {
namespace {

// "127.x.x.x:P", "localhost:P", "[::1]:P" or "unix:PATH": reachable from this host only.
bool IsLoopbackListen(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr.rfind("localhost:", 0) == 0 ||
         addr.rfind("[::1]:", 0) == 0 || addr.rfind("unix:", 0) == 0;
}

}  // namespace

absl::StatusOr<SchedulerDaemonOptions> ParseSchedulerFlags(int argc, char** argv) {
  static const std::set<std::string> kFlags = {
      "--listen",     "--port-file", "--slots",          "--ctx",       "--split",
      "--slot-cap",   "--max-queue", "--max-batch-tokens", "--max-chunk", "--max-slots",
      "--slot-ctx",   "--step-timeout", "--warmup-tokens", "--log-interval",
      "--failover-wait", "--internal-key-file", "--tls-cert", "--tls-key",
      "--allow-unauthenticated", "--lookahead", "--heartbeat-timeout",
      "--overcommit-headroom", "--prefix-cache", "--prefix-cache-interval",
      "--prefix-cache-min", "--prefix-cache-wait"};
  DS_ASSIGN_OR_RETURN(auto m, config::ParseFlagPairs(argc, argv, kFlags));
  SchedulerDaemonOptions o;
  sched::LoopOptions& l = o.loop;
  l.core.n_slots = 4;
  l.core.context.kind = sched::ContextPolicy::Kind::kPool;
  l.core.context.n_ctx = 4096;
  // Prefix cache (issue #17): planned wherever a worker reports a checkpoint store.
  l.core.prefix_cache.enabled = true;
  auto integer = [&](const char* f, auto* v) -> absl::Status {
    if (!m.count(f)) return absl::OkStatus();
    int64_t x = 0;
    if (!absl::SimpleAtoi(m[f], &x) || x < 0)
      return absl::InvalidArgumentError(absl::StrCat(f, " expects an integer >= 0, got '", m[f], "'"));
    *v = static_cast<std::remove_reference_t<decltype(*v)>>(x);
    return absl::OkStatus();
  };
  auto real = [&](const char* f, double* v) -> absl::Status {
    if (m.count(f) && (!absl::SimpleAtod(m[f], v) || *v < 0))
      return absl::InvalidArgumentError(absl::StrCat(f, " expects a number >= 0, got '", m[f], "'"));
    return absl::OkStatus();
  };
  if (m.count("--listen")) o.listen = m["--listen"];
  if (m.count("--port-file")) o.port_file = m["--port-file"];
  if (m.count("--internal-key-file")) o.internal_key_file = m["--internal-key-file"];
  if (m.count("--tls-cert")) o.tls_cert = m["--tls-cert"];
  if (m.count("--tls-key")) o.tls_key = m["--tls-key"];
  if (m.count("--allow-unauthenticated")) {
    const std::string& v = m["--allow-unauthenticated"];
    if (v == "true" || v == "1" || v == "yes") {
      o.allow_unauthenticated = true;
    } else if (v != "false" && v != "0" && v != "no") {
      return absl::InvalidArgumentError("--allow-unauthenticated expects true or false, got '" +
                                        v + "'");
    }
  }
  // Whoever reaches the internal port can register a worker (and receive every prompt), submit
  // requests, drain the cluster and read or overwrite the TP rendezvous: beyond loopback it needs
  // tokens, or the operator's explicit word that the network is private.
  if (!IsLoopbackListen(o.listen) && o.internal_key_file.empty() && !o.allow_unauthenticated)
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen ", o.listen,
        " is not a loopback address: give --internal-key-file FILE (bearer tokens; workers and "
        "gateways send one with --scheduler-key-file) or, on a trusted private network only, "
        "--allow-unauthenticated true"));
  DS_RETURN_IF_ERROR(integer("--slots", &l.core.n_slots));
  DS_RETURN_IF_ERROR(integer("--ctx", &l.core.context.n_ctx));
  DS_RETURN_IF_ERROR(integer("--slot-cap", &l.core.context.slot_cap));
  // Pool policy over-commit (issue #23): reserve known tokens + N, grow by N, preempt the youngest
  // when the pool is short (they resume by re-prefill). 0 = reserve the worst case.
  DS_RETURN_IF_ERROR(integer("--overcommit-headroom", &l.core.context.overcommit_headroom));
  DS_RETURN_IF_ERROR(integer("--max-queue", &l.core.max_queue));
  DS_RETURN_IF_ERROR(integer("--max-batch-tokens", &l.core.max_num_batched_tokens));
  DS_RETURN_IF_ERROR(integer("--max-chunk", &l.core.max_chunk));
  DS_RETURN_IF_ERROR(integer("--max-slots", &l.max_slots));
  DS_RETURN_IF_ERROR(integer("--slot-ctx", &l.slot_ctx));
  DS_RETURN_IF_ERROR(integer("--warmup-tokens", &l.warmup_tokens));
  DS_RETURN_IF_ERROR(real("--step-timeout", &l.step_timeout_s));
  DS_RETURN_IF_ERROR(real("--log-interval", &l.log_interval_s));
  DS_RETURN_IF_ERROR(real("--failover-wait", &l.failover_wait_s));
  DS_RETURN_IF_ERROR(real("--heartbeat-timeout", &l.heartbeat_timeout_s));
  if (m.count("--lookahead")) {
    if (m["--lookahead"] != "on" && m["--lookahead"] != "off")
      return absl::InvalidArgumentError("--lookahead expects on or off, got '" + m["--lookahead"] + "'");
    l.lookahead = m["--lookahead"] == "on";
  }
  if (m.count("--prefix-cache")) {
    if (m["--prefix-cache"] != "on" && m["--prefix-cache"] != "off")
      return absl::InvalidArgumentError("--prefix-cache expects on or off, got '" +
                                        m["--prefix-cache"] + "'");
    l.core.prefix_cache.enabled = m["--prefix-cache"] == "on";
  }
  DS_RETURN_IF_ERROR(integer("--prefix-cache-interval", &l.core.prefix_cache.interval));
  DS_RETURN_IF_ERROR(integer("--prefix-cache-min", &l.core.prefix_cache.min_tokens));
  DS_RETURN_IF_ERROR(integer("--prefix-cache-wait", &l.core.prefix_cache.wait_gain));
  if (l.core.prefix_cache.min_tokens < 1) l.core.prefix_cache.min_tokens = 1;
  if (m.count("--split")) {
    if (m["--split"] == "static") {
      l.core.context.kind = sched::ContextPolicy::Kind::kStatic;
    } else if (m["--split"] == "pool") {
      l.core.context.kind = sched::ContextPolicy::Kind::kPool;
    } else {
      return absl::InvalidArgumentError("--split expects static or pool, got '" + m["--split"] + "'");
    }
  }
  if (l.max_slots > 0 && l.core.n_slots > l.max_slots)
    return absl::InvalidArgumentError(
        absl::StrCat("--slots ", l.core.n_slots, " > --max-slots ", l.max_slots));
  if (l.slot_ctx > 0) {
    // Workers are given slots of --slot-ctx positions; a policy that lets one slot grow past that
    // could never be served, so refuse it here rather than when the first worker registers.
    const sched::ContextPolicy& p = l.core.context;
    const int64_t cap = p.kind == sched::ContextPolicy::Kind::kStatic
                            ? p.n_ctx / std::max(1, l.core.n_slots)
                            : (p.slot_cap > 0 ? std::min<int64_t>(p.slot_cap, p.n_ctx) : p.n_ctx);
    if (l.slot_ctx < cap)
      return absl::InvalidArgumentError(absl::StrCat(
          "--slot-ctx ", l.slot_ctx, " is below the per-slot cap ", cap,
          " (pool: --slot-cap, or --ctx when it is unset; static: --ctx / --slots)"));
  }
  return o;
}

int RunSchedulerDaemon(int argc, char** argv) {
  constexpr const char* kUsage =
      "usage: deltaserve scheduler [--listen 127.0.0.1:PORT] "
      "[--port-file FILE] [--slots N] [--ctx N] [--split static|pool] [--slot-cap N] "
      "[--max-queue N] [--max-batch-tokens N] [--max-chunk N] [--max-slots N] "
      "[--slot-ctx N] [--step-timeout S] [--warmup-tokens N] [--log-interval S] [--failover-wait S] [--heartbeat-timeout S] "
      "[--lookahead on|off] [--overcommit-headroom N] "
      "[--prefix-cache on|off] [--prefix-cache-interval N] [--prefix-cache-min N] [--prefix-cache-wait N] "
      "[--internal-key-file F] [--tls-cert F --tls-key F] "
      "[--allow-unauthenticated true] "
      "[--metrics-listen HOST:PORT] [--log-level L] [--config FILE]\n";
  if (config::HelpRequested(argc, argv, kUsage)) return 0;
  auto role = config::SetUpRole("scheduler", argc, argv);
  absl::StatusOr<SchedulerDaemonOptions> o =
      role.ok() ? ParseSchedulerFlags(role->args.argc(), role->args.argv())
                : absl::StatusOr<SchedulerDaemonOptions>(role.status());
  if (role.ok() && !o.ok()) o = role->args.Explain(o.status());
  if (!o.ok()) {
    std::fprintf(stderr, "deltaserve scheduler: %s\n%s", std::string(o.status().message()).c_str(),
                 kUsage);
    return 2;
  }
  // Signals are taken synchronously by this thread (sigwait); every thread started from here on
  // inherits the blocked mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  auto fail = [](const absl::Status& s) {
    DS_LOG(ERROR, "start_failed", {{"error", s}});
    std::fprintf(stderr, "deltaserve scheduler: %s\n", s.ToString().c_str());
    return 1;
  };
  auto loop = sched::SchedulerLoop::Create(o->loop);
  if (!loop.ok()) return fail(loop.status());
  auto metrics_server = metrics::MetricsServer::Start(role->metrics_listen, "scheduler");
  if (!metrics_server.ok()) return fail(metrics_server.status());
  metrics::SchedulerMetrics sched_metrics((*metrics_server)->registry());
  (*loop)->SetMetrics(&sched_metrics);
  std::unique_ptr<sd::Watchdog> watchdog = sd::Watchdog::FromEnvironment();
  watchdog->SetStallCallback([](const std::string& name, double overdue_s) {
    DS_LOG(ERROR, "watchdog_stall", {{"loop", name}, {"overdue_s", overdue_s}});
  });
  if (watchdog->enabled())
    (*loop)->SetWatchdogLoop(watchdog->RegisterPeriodic(
        "scheduler_loop", std::max<std::chrono::nanoseconds>(std::chrono::seconds(5),
                                                             watchdog->interval() / 2)));
  // Key file and certificate are checked before anything listens: one clear error at start.
  auth::TokenSet tokens;
  if (!o->internal_key_file.empty()) {
    auto t = auth::TokenSet::FromFile(o->internal_key_file);
    if (!t.ok()) return fail(t.status());
    tokens = std::move(*t);
  }
  auto creds = auth::MakeServerCredentials({o->tls_cert, o->tls_key, ""});
  if (!creds.ok()) return fail(creds.status());
  if (!IsLoopbackListen(o->listen)) {
    if (tokens.open())
      DS_LOG(WARNING, "internal_port_public",
             {{"listen", o->listen},
              {"detail", "--allow-unauthenticated: any host that reaches this port can register "
                         "workers and submit requests"}});
    else if (o->tls_cert.empty())
      DS_LOG(WARNING, "internal_port_plaintext",
             {{"listen", o->listen},
              {"detail", "tokens and prompts travel unencrypted; add --tls-cert/--tls-key off a "
                         "trusted network"}});
  }
  sched::ClusterService service(loop->get());
  service.SetTokens(std::move(tokens));
  grpc::ServerBuilder builder;
  int port = 0;
  auth::AddExclusiveListeningPort(&builder, o->listen, *creds, &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&service);
  (*loop)->Start();
  auto started = auth::BuildAndStartListener(&builder, o->listen, &port);
  if (!started.ok()) {
    (*loop)->Stop();
    return fail(started.status());
  }
  std::unique_ptr<grpc::Server> server = std::move(*started);
  const std::string host = o->listen.substr(0, o->listen.rfind(':'));
  const int metrics_port = (*metrics_server)->port();
  DS_LOG(INFO, "listening",
         {{"internal", absl::StrCat(host, ":", port)},
          {"metrics", metrics_port > 0 ? role->metrics_listen.substr(0, role->metrics_listen.rfind(':')) +
                                             ":" + std::to_string(metrics_port)
                                       : std::string("off")},
          {"tls", !o->tls_cert.empty()}, {"internal_keys", !o->internal_key_file.empty()},
          {"slots", o->loop.core.n_slots}, {"ctx", o->loop.core.context.n_ctx},
          {"max_queue", o->loop.core.max_queue}});
  if (!o->port_file.empty()) {
    // Written then renamed so a reader never sees a partial file.
    const std::string tmp = o->port_file + ".tmp";
    std::ofstream(tmp) << port << " " << metrics_port << "\n";
    std::rename(tmp.c_str(), o->port_file.c_str());
  }
  watchdog->Start();
  // Ready = workers and gateways can connect; the gateway reports SERVING once a worker is warm.
  sd::NotifyReady(absl::StrCat("listening on ", host, ":", port, "; waiting for workers"));
  int sig = 0;
  sigwait(&sigs, &sig);
  DS_LOG(INFO, "stopping", {{"signal", sig}});
  sd::NotifyStopping("failing queued requests, shutting workers down");
  (*loop)->Stop();
  watchdog->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  return 0;
}

}  // namespace ds
