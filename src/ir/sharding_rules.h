// The sharding rules of the op registry (ir/sharding_signature.h), one per
// compute type family; OpRegistry() (shapes.cc) points at them.
#pragma once

#include "concerto/ir/sharding_signature.h"

namespace concerto::sharding_rules {

Result<ShardingSignature> Matmul(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Add(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Scale(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Elementwise(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Softmax(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Norm(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Attention(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Embedding(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> EmbeddingGrad(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> RowReduction(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> CrossEntropy(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> CrossEntropyGrad(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Slice(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Concat(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Identity(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Transpose(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Conv2d(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> Pool2d(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> BatchNorm(const Op& op, const ShardingRuleContext& ctx);
Result<ShardingSignature> BatchNormStats(const Op& op, const ShardingRuleContext& ctx);

}  // namespace concerto::sharding_rules
