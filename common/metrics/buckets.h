// Histogram bucket boundaries, one set per kind of quantity, chosen for a 27B model on one GPU
// down to the tiny test model on a CPU. The latency objective in monitoring/rules/ reads the
// `le="2.5"` bucket of time to first token: keep 2.5 in kTimeToFirstToken.
#pragma once
#include <vector>

namespace ds::metrics {

// Seconds from request arrival to its first generated token (prefill of up to ~32k tokens).
inline const std::vector<double> kTimeToFirstTokenBuckets = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120};
// Seconds between consecutive tokens of one request (decode steps: ~5 ms at batch 1 on an H200,
// tens of ms at large batches, more when prefill chunks share the step).
inline const std::vector<double> kInterTokenBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5};
// Seconds a request waits for a slot.
inline const std::vector<double> kQueueWaitBuckets = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120};
// Seconds from arrival to the last token (up to thousands of generated tokens).
inline const std::vector<double> kRequestDurationBuckets = {0.05, 0.1, 0.25, 0.5, 1,   2.5, 5,
                                                            10,   20,  40,   80,  160, 320, 600};
// Seconds of one scheduler step / one worker forward pass.
inline const std::vector<double> kStepBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01,
                                                 0.015,  0.02,  0.03,   0.05,  0.075,  0.1,
                                                 0.25,   0.5,   1,      2.5};
// Tokens processed in one step (decode tokens + prefill chunks, up to the step token budget).
inline const std::vector<double> kBatchTokenBuckets = {1,   2,   4,   8,    16,   32,   64,
                                                       128, 256, 512, 1024, 2048, 4096, 8192};
// Sequences advanced in one step (bounded by the slot count).
inline const std::vector<double> kBatchSequenceBuckets = {1, 2, 4, 8, 16, 32, 64, 128};

}  // namespace ds::metrics
