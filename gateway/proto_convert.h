// The public edge: deltaserve.v1 messages <-> the gateway's plain structs. Nothing past this file
// (validation, tokenization, output assembly) sees a protobuf type.
#pragma once
#include "deltaserve/v1/deltaserve.pb.h"
#include "gateway/request.h"

namespace ds::gw {

GenerateInput FromProto(const deltaserve::v1::GenerateRequest& r);
GenerateInput FromProto(const deltaserve::v1::TokenizeRequest& r);

void ToProto(const OutputChunk& c, deltaserve::v1::GenerateResponse::Chunk* out);
void ToProto(const FinishInfo& f, deltaserve::v1::GenerateResponse::Finished* out);
deltaserve::v1::FinishReason ToProto(FinishReason r);

}  // namespace ds::gw
