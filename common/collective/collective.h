// ds::Collective: the one communication interface tensor parallelism uses between the worker
// processes of a TP group. Two implementations: GlooCollective (CPU buffers, TCP) and
// NcclCollective (device buffers, built only with CUDA). No algorithm lives here: every call maps
// onto one library collective (gloo::allreduce, ncclAllReduce, ...).
//
// Contract shared by both implementations:
//   * every rank of the group calls the same sequence of collectives with the same sizes;
//   * calls are blocking: on return the result is in the output buffer (NCCL: the stream is
//     synchronised), so the caller may reuse the buffers at once;
//   * errors (peer gone, timeout, size mismatch detected) come back as absl::Status, never as an
//     exception or a crash; after an error the group is unusable and must be rebuilt.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/util/status.h"

namespace ds {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string name() const = 0;  // "gloo", "nccl"

  // data[0..n) ← Σ over ranks of data[0..n) (in place, f32).
  virtual absl::Status AllReduceSum(float* data, size_t n) = 0;
  // out[r·n .. (r+1)·n) ← rank r's in[0..n). out holds world·n floats; in may not alias out.
  virtual absl::Status AllGather(const float* in, size_t n, float* out) = 0;
  // Uneven form: rank r contributes counts[r] floats (in holds counts[rank()]); out holds
  // Σ counts, rank-major (rank 0's block first).
  virtual absl::Status AllGatherV(const float* in, std::span<const size_t> counts, float* out) = 0;
  // data[0..bytes) on every rank ← root's data[0..bytes).
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // Stream-ordered form of AllReduceSum for device buffers: enqueued on `stream` (a cudaStream_t)
  // after the work already there, without waiting for it — the caller's stream orders the
  // reduction, and the call may be captured into a CUDA graph. Only device collectives implement
  // it (NCCL; Solo as the identity); supports_stream_ordered() says whether this one does.
  virtual bool supports_stream_ordered() const { return false; }
  virtual absl::Status AllReduceSumOnStream(float* data, size_t n, void* stream) {
    return absl::UnimplementedError("collective " + name() +
                                    " has no stream-ordered all-reduce (device buffers need nccl)");
  }
  // h[rows, n] <- sum over the ranks (as AllReduceSumOnStream), then out[rows, n] =
  // RMSNorm(h) * w (eps), and when xq is set its int8 quantization in blocks of 32 (xq, scales
  // xd; the layout of the GEMV kernels' activations): the TP all-reduce fused with the norm that
  // follows it, one launch and one pass over the row instead of three. Device pointers; every
  // rank gets the same h and out. Unimplemented: run AllReduceSumOnStream and the norm.
  struct FusedNormArgs {
    float* h = nullptr;
    int rows = 0;
    int n = 0;
    const float* w = nullptr;
    float eps = 1e-6f;
    float* out = nullptr;
    int8_t* xq = nullptr;  // optional
    float* xd = nullptr;   // with xq
  };
  virtual absl::Status AllReduceRmsNormOnStream(const FusedNormArgs& a, void* stream) {
    return absl::UnimplementedError("collective " + name() + " has no fused all-reduce + norm");
  }
  // Whether AllReduceSumOnStream may be recorded into a CUDA graph (stream capture). True for
  // NCCL and Solo; false for HostStagedCollective, which synchronises the stream and runs the
  // sum on the host: a caller that captures graphs must run such a collective eagerly.
  virtual bool graph_capturable() const { return true; }
};

// A world of one: every collective is the identity. Lets TP code run with world = 1 without
// special cases and without a transport.
class SoloCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  std::string name() const override { return "solo"; }
  absl::Status AllReduceSum(float*, size_t) override { return absl::OkStatus(); }
  absl::Status AllGather(const float* in, size_t n, float* out) override;
  absl::Status AllGatherV(const float* in, std::span<const size_t> counts, float* out) override;
  absl::Status Broadcast(void*, size_t, int root) override;
  absl::Status Barrier() override { return absl::OkStatus(); }
  bool supports_stream_ordered() const override { return true; }
  absl::Status AllReduceSumOnStream(float*, size_t, void*) override { return absl::OkStatus(); }
};

}  // namespace ds
