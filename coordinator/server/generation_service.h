// moe.v1.Generation over the engine: Generate streams a job's events to the client, and turns a
// closed stream or a passed deadline into cancellation of the job; the tokenizer calls run on the
// RPC thread (the tokenizer and template are immutable, so that is safe).
#pragma once

#include "coordinator/server/grpc_auth.h"
#include "coordinator/server/serving_state.h"
#include "moe/v1/generation.grpc.pb.h"

namespace moe::server {

class GenerationService final : public v1::Generation::Service {
 public:
  // Every method needs auth.client().
  GenerationService(ServingState& state, const GrpcAuth& auth) : state_(state), auth_(auth) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* ctx, const v1::TokenizeRequest* req,
                        v1::TokenizeResponse* resp) override;
  grpc::Status Detokenize(grpc::ServerContext* ctx, const v1::DetokenizeRequest* req,
                          v1::DetokenizeResponse* resp) override;
  grpc::Status ApplyChatTemplate(grpc::ServerContext* ctx, const v1::ApplyChatTemplateRequest* req,
                                 v1::ApplyChatTemplateResponse* resp) override;

 private:
  ServingState& state_;
  const GrpcAuth& auth_;
};

}  // namespace moe::server
