// HostStagedCollective (see host_staged_collective.h).
#include "common/collective/host_staged_collective.h"

#include <numeric>

#include "absl/strings/str_cat.h"

namespace ds {

HostStagedCollective::HostStagedCollective(std::unique_ptr<Collective> host,
                                           std::unique_ptr<StagingDevice> device)
    : host_(std::move(host)), dev_(std::move(device)) {}

absl::StatusOr<void*> HostStagedCollective::Stage(const void* p, size_t bytes,
                                                  std::vector<uint8_t>* buf, bool fill,
                                                  void* stream, bool* staged) {
  DS_ASSIGN_OR_RETURN(*staged, dev_->IsDevice(p));
  if (!*staged) return const_cast<void*>(p);
  if (buf->size() < bytes) buf->resize(bytes);
  if (fill && bytes) DS_RETURN_IF_ERROR(dev_->ToHost(buf->data(), p, bytes, stream));
  return static_cast<void*>(buf->data());
}

absl::Status HostStagedCollective::AllReduceSumOnStream(float* data, size_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  bool staged = false;
  DS_ASSIGN_OR_RETURN(void* h, Stage(data, n * sizeof(float), &in_, true, stream, &staged));
  DS_RETURN_IF_ERROR(host_->AllReduceSum(static_cast<float*>(h), n));
  if (staged) DS_RETURN_IF_ERROR(dev_->ToDevice(data, h, n * sizeof(float), stream));
  return absl::OkStatus();
}

absl::Status HostStagedCollective::AllReduceSum(float* data, size_t n) {
  return AllReduceSumOnStream(data, n, nullptr);
}

absl::Status HostStagedCollective::AllGather(const float* in, size_t n, float* out) {
  const size_t out_n = n * static_cast<size_t>(world());
  bool in_staged = false, out_staged = false;
  DS_ASSIGN_OR_RETURN(void* hi, Stage(in, n * sizeof(float), &in_, true, nullptr, &in_staged));
  DS_ASSIGN_OR_RETURN(void* ho, Stage(out, out_n * sizeof(float), &out_, false, nullptr, &out_staged));
  DS_RETURN_IF_ERROR(host_->AllGather(static_cast<const float*>(hi), n, static_cast<float*>(ho)));
  if (out_staged && out_n) DS_RETURN_IF_ERROR(dev_->ToDevice(out, ho, out_n * sizeof(float), nullptr));
  return absl::OkStatus();
}

absl::Status HostStagedCollective::AllGatherV(const float* in, std::span<const size_t> counts,
                                              float* out) {
  if (static_cast<int>(counts.size()) != world())
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherV: ", counts.size(), " counts for a world of ", world()));
  const size_t mine = counts[rank()];
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  bool in_staged = false, out_staged = false;
  DS_ASSIGN_OR_RETURN(void* hi, Stage(in, mine * sizeof(float), &in_, true, nullptr, &in_staged));
  DS_ASSIGN_OR_RETURN(void* ho, Stage(out, total * sizeof(float), &out_, false, nullptr, &out_staged));
  DS_RETURN_IF_ERROR(host_->AllGatherV(static_cast<const float*>(hi), counts, static_cast<float*>(ho)));
  if (out_staged && total) DS_RETURN_IF_ERROR(dev_->ToDevice(out, ho, total * sizeof(float), nullptr));
  return absl::OkStatus();
}

absl::Status HostStagedCollective::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= world())
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " not in a world of ", world()));
  bool staged = false;
  // Only the root's bytes matter; the others are overwritten.
  DS_ASSIGN_OR_RETURN(void* h, Stage(data, bytes, &in_, rank() == root, nullptr, &staged));
  DS_RETURN_IF_ERROR(host_->Broadcast(h, bytes, root));
  if (staged && bytes) DS_RETURN_IF_ERROR(dev_->ToDevice(data, h, bytes, nullptr));
  return absl::OkStatus();
}

}  // namespace ds
