// Error handling used across deltaserve: absl::Status / absl::StatusOr for every fallible API.
// The gateway maps these codes to gRPC codes in one place (gateway/status_map).
#pragma once
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define DS_CONCAT_INNER_(a, b) a##b
#define DS_CONCAT_(a, b) DS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define DS_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::absl::Status ds_status_ = (expr);     \
    if (!ds_status_.ok()) return ds_status_; \
  } while (0)

// DS_ASSIGN_OR_RETURN(auto x, MakeX()); returns the error status if MakeX() failed.
#define DS_ASSIGN_OR_RETURN(lhs, expr) \
  DS_ASSIGN_OR_RETURN_IMPL_(DS_CONCAT_(ds_statusor_, __LINE__), lhs, expr)
#define DS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
