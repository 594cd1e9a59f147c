// Evoformer frontend: AlphaFold sizes, FastFold DAP collectives per block,
// flops and parameters against hand formulas, the distogram and masked-MSA
// heads and their losses, rejection of bad plans, and a fifo schedule
// simulated without deadlock. Arithmetic in the comments.
#include "concerto/lower/evoformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/verifier.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

EvoformerConfig Preset(const std::string& name) {
  Result<EvoformerConfig> c = EvoformerPreset(name);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : EvoformerConfig{};
}

/// LowerEvoformer that must succeed.
Program Lower(const EvoformerConfig& c, int dp, int dap) {
  Result<Program> p = LowerEvoformer(c, dp, dap);
  EXPECT_TRUE(p.ok()) << c.name << " dp=" << dp << " dap=" << dap << ": " << p.status().message();
  return p.ok() ? *p : Program{};
}

const Graph& Main(const Program& p) { return p.graphs.at(0); }

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// Collectives of `type` in block `layer` and `phase` (any group, any purpose).
std::vector<const Op*> Collectives(const Graph& g, int layer, Phase phase, CollectiveType type) {
  std::vector<const Op*> out;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCollective && op.tags.layer == layer && op.tags.phase == phase &&
        op.collective == type)
      out.push_back(&op);
  return out;
}

/// Message bytes of `ops`, sorted; every op must be a dap activation collective.
std::vector<int64_t> DapBytes(const std::vector<const Op*>& ops) {
  std::vector<int64_t> bytes;
  for (const Op* op : ops) {
    EXPECT_EQ(op->group.axes, std::vector<std::string>{"dap"}) << op->name;
    EXPECT_EQ(op->tags.purpose, "activation") << op->name;
    bytes.push_back(op->message_bytes);
  }
  std::sort(bytes.begin(), bytes.end());
  return bytes;
}

std::vector<int64_t> Sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

/// Sum of matmul/attention flops of forward ops in block 0 whose name starts with `prefix`.
double ForwardMatmulFlops(const Graph& g, const std::string& prefix) {
  double total = 0;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCompute && op.tags.phase == Phase::kForward && op.tags.layer == 0 &&
        StartsWith(op.name, prefix) &&
        (op.compute_type == ComputeType::kMatmul || op.compute_type == ComputeType::kAttention))
      total += op.flops;
  return total;
}

std::map<std::string, const Tensor*> Tensors(const Graph& g) {
  std::map<std::string, const Tensor*> t;
  for (const Tensor& x : g.tensors) t[x.name] = &x;
  return t;
}

TEST(EvoformerTest, Presets) {
  EXPECT_EQ(EvoformerPresetNames(), (std::vector<std::string>{"evoformer-tiny", "evoformer"}));
  EvoformerConfig c = Preset("evoformer");  // REFERENCES.md: AlphaFold training sizes
  EXPECT_EQ(c.blocks, 48);
  EXPECT_EQ(c.c_m, 256);
  EXPECT_EQ(c.c_z, 128);
  EXPECT_EQ(c.n_res, 256);
  EXPECT_EQ(c.n_seq, 128);
  EXPECT_EQ(c.msa_heads * c.msa_head_dim, 8 * 32);
  EXPECT_EQ(c.tri_heads * c.tri_head_dim, 4 * 32);
  EXPECT_EQ(Preset("evoformer-tiny").blocks, 1);
  Result<EvoformerConfig> bad = EvoformerPreset("alphafold");
  ASSERT_FALSE(bad.ok());
  EXPECT_HAS(bad.status().message(), "evoformer-tiny, evoformer");
}

TEST(EvoformerTest, VerifiesUnderEveryPlan) {
  for (const std::string& name : EvoformerPresetNames())
    for (int dap : {1, 2, 4, 8})
      for (int dp : {1, 4}) {
        Program p = Lower(Preset(name), dp, dap);
        std::vector<std::string> errors = VerifyProgram(p);
        EXPECT_TRUE(errors.empty()) << name << " dp=" << dp << " dap=" << dap << ": "
                                    << (errors.empty() ? "" : errors[0]);
        ASSERT_EQ(p.mesh.axes.size(), 2u);
        EXPECT_EQ(p.mesh.axes[0].name, "dp");
        EXPECT_EQ(p.mesh.axes[1].name, "dap");
        EXPECT_EQ(p.mesh.NumRanks(), dp * dap);
        ASSERT_EQ(p.roles.size(), 1u);
        EXPECT_EQ(p.roles[0].ranks.size(), static_cast<size_t>(dp * dap));
      }
}

// FastFold DAP, evoformer at dap = 8, bf16 (2 bytes); s = 128, r = 256,
// c_m = 256, c_z = 128, 8 MSA heads x 32, 4 triangle heads x 32, OPM 32,
// triangle-multiplication width 128. All-gather messages (this rank's shard):
//   msa_row pair bias [8, 256/8, 256]       = 8*32*256*2     =   131,072
//   opm right projection [128, 256/8, 32]   = 128*32*32*2    =   262,144
//   tri_mul_out right (b) [128, 256/8, 256] = 128*32*256*2   = 2,097,152
//   tri_mul_in right (a)                    =                  2,097,152
//   tri_att_start bias [4, 256/8, 256]      = 4*32*256*2     =    65,536
//   tri_att_end bias                        =                     65,536
// All-to-alls (the whole local tensor): MSA [128/8, 256, 256] = 16*256*256*2
// = 2,097,152 (x2: to columns, back to rows); pair [256/8, 256, 128] =
// 32*256*128*2 = 2,097,152 (x4). Backward: reduce-scatters of 8x the gathers'
// bytes (the full buffer) and the same six all-to-alls.
TEST(EvoformerTest, DapCollectivesPerBlock) {
  Program p = Lower(Preset("evoformer"), 1, 8);
  const Graph& g = Main(p);
  const std::vector<int64_t> gathers = Sorted({131072, 262144, 2097152, 2097152, 65536, 65536});
  std::vector<int64_t> scatters;
  for (int64_t b : gathers) scatters.push_back(8 * b);
  const std::vector<int64_t> a2a(6, 2097152);
  for (int l : {0, 23, 47}) {
    EXPECT_EQ(DapBytes(Collectives(g, l, Phase::kForward, CollectiveType::kAllGather)), gathers);
    EXPECT_EQ(DapBytes(Collectives(g, l, Phase::kForward, CollectiveType::kAllToAll)), a2a);
    EXPECT_EQ(DapBytes(Collectives(g, l, Phase::kBackward, CollectiveType::kReduceScatter)),
              scatters);
    EXPECT_EQ(DapBytes(Collectives(g, l, Phase::kBackward, CollectiveType::kAllToAll)), a2a);
    EXPECT_TRUE(Collectives(g, l, Phase::kForward, CollectiveType::kAllReduce).empty());
    EXPECT_TRUE(Collectives(g, l, Phase::kForward, CollectiveType::kReduceScatter).empty());
    EXPECT_TRUE(Collectives(g, l, Phase::kBackward, CollectiveType::kAllGather).empty());
  }
}

// The tiny preset at dap = 2: s = 8, r = 16, c_m = 16, c_z = 8, 2x4 heads
// everywhere, OPM 4, triangle width 8. Gathers: msa_row bias 2*8*16*2 = 512,
// opm 8*8*4*2 = 512, tri_mul 8*8*16*2 = 2048 (x2), tri_att bias 2*8*16*2 =
// 512 (x2). All-to-alls: MSA 4*16*16*2 = 2048, pair 8*16*8*2 = 2048.
TEST(EvoformerTest, TinyDapCollectives) {
  Program p = Lower(Preset("evoformer-tiny"), 1, 2);
  const Graph& g = Main(p);
  EXPECT_EQ(DapBytes(Collectives(g, 0, Phase::kForward, CollectiveType::kAllGather)),
            Sorted({512, 512, 2048, 2048, 512, 512}));
  EXPECT_EQ(DapBytes(Collectives(g, 0, Phase::kForward, CollectiveType::kAllToAll)),
            std::vector<int64_t>(6, 2048));
  EXPECT_EQ(DapBytes(Collectives(g, 0, Phase::kBackward, CollectiveType::kReduceScatter)),
            Sorted({1024, 1024, 4096, 4096, 1024, 1024}));
  EXPECT_EQ(DapBytes(Collectives(g, 0, Phase::kBackward, CollectiveType::kAllToAll)),
            std::vector<int64_t>(6, 2048));
}

// FastFold's order inside a block: the pair-bias gather, MSA to columns, the
// OPM gather, MSA back to rows, then the pair stack alternating gather and
// switch. After the block the distogram head transposes its logits (the
// mirror switch) to symmetrise them.
TEST(EvoformerTest, DapCollectiveOrder) {
  Program p = Lower(Preset("evoformer-tiny"), 1, 4);
  std::vector<std::string> order;
  for (const Op& op : Main(p).ops)
    if (op.kind == OpKind::kCollective && op.tags.phase == Phase::kForward)
      order.push_back(std::string(ToString(op.collective)) + " " + op.name);
  EXPECT_EQ(order, (std::vector<std::string>{
                       "all_gather b0.msa_row.bias.ag", "all_to_all b0.msa.to_col.a2a",
                       "all_gather b0.opm.b.ag", "all_to_all b0.msa.to_row.a2a",
                       "all_gather b0.tri_mul_out.b.ag", "all_to_all b0.pair.to_col1.a2a",
                       "all_gather b0.tri_mul_in.a.ag", "all_to_all b0.pair.to_row1.a2a",
                       "all_gather b0.tri_att_start.bias.ag", "all_to_all b0.pair.to_col2.a2a",
                       "all_gather b0.tri_att_end.bias.ag", "all_to_all b0.pair.to_row2.a2a",
                       "all_to_all head.distogram.mirror.a2a"}));
}

TEST(EvoformerTest, NoDapCollectivesWithoutDap) {
  Program p = Lower(Preset("evoformer-tiny"), 4, 1);
  for (const Op& op : Main(p).ops)
    if (op.kind == OpKind::kCollective) {
      EXPECT_EQ(op.collective, CollectiveType::kAllReduce) << op.name;
      EXPECT_EQ(op.tags.purpose, "grad_sync") << op.name;
      EXPECT_EQ(op.group.axes, std::vector<std::string>{"dp"}) << op.name;
    }
}

// MSA row attention with pair bias, forward matmul flops (global; per rank
// divide by dap since rows and the bias are sharded):
//   q, k, v, gate   4 * 2*s*r*c_m*(H*c) = 4 * 2*128*256*256*256 = 17,179,869,184
//   pair bias         2*r*r*c_z*H       = 2*256*256*128*8       =    134,217,728
//   scores + p x v    4*s*r^2*H*c       = 4*128*256^2*8*32      =  8,589,934,592
//   output            2*s*r*(H*c)*c_m   = 2*128*256*256*256     =  4,294,967,296
//   total                                                          30,198,988,800
// Triangle multiplication (each of outgoing, incoming), width t = 128:
//   4 projections     4 * 2*r^2*c_z*t   = 4 * 2*256^2*128*128   =  8,589,934,592
//   core              2*t*r^3           = 2*128*256^3           =  4,294,967,296
//   output            2*r^2*t*c_z       =                          2,147,483,648
//   gate              2*r^2*c_z^2       =                          2,147,483,648
//   total                                                          17,179,869,184
TEST(EvoformerTest, ForwardFlopsMatchHandFormulas) {
  const EvoformerConfig c = Preset("evoformer");
  const double s = c.n_seq, r = c.n_res, cm = c.c_m, cz = c.c_z, hc = 8 * 32, t = 128;
  const double row = 4 * 2 * s * r * cm * hc + 2 * r * r * cz * 8 + 4 * s * r * r * hc +
                     2 * s * r * hc * cm;
  const double mul = 4 * 2 * r * r * cz * t + 2 * t * r * r * r + 2 * r * r * t * cz +
                     2 * r * r * cz * cz;
  EXPECT_EQ(row, 30198988800.0);
  EXPECT_EQ(mul, 17179869184.0);
  for (int dap : {1, 8}) {
    Program p = Lower(c, 1, dap);
    const Graph& g = Main(p);
    EXPECT_DOUBLE_EQ(ForwardMatmulFlops(g, "b0.msa_row."), row / dap) << dap;
    EXPECT_DOUBLE_EQ(ForwardMatmulFlops(g, "b0.tri_mul_out."), mul / dap) << dap;
    EXPECT_DOUBLE_EQ(ForwardMatmulFlops(g, "b0.tri_mul_in."), mul / dap) << dap;
    // MSA column attention uses the attention op: 4*r*s^2*H*c = 4*256*128^2*256.
    double col_core = 0;
    for (const Op& op : g.ops)
      if (op.name == "b0.msa_col.core") col_core = op.flops;
    EXPECT_DOUBLE_EQ(col_core, 4.0 * r * s * s * hc / dap);
  }
}

// Parameters per block, no biases (c_m = 256, c_z = 128, MSA heads 8x32,
// triangle heads 4x32, OPM 32, triangle width 128, transition x4):
//   msa_row   2*256 + 2*128 + 4*256*256 + 128*8 + 256*256 =   329,472
//   msa_col   2*256 + 4*256*256 + 256*256                 =   328,192
//   msa_trans 2*256 + 2*4*256*256                         =   524,800
//   opm       2*256 + 2*256*32 + 32*32*128                =   147,968
//   tri_mul   2*128 + 4*128*128 + 2*128 + 128*128 + 128^2 =    98,816 (x2)
//   tri_att   2*128 + 4*128*128 + 128*4 + 128*128         =    82,688 (x2)
//   pair_trans 2*128 + 2*4*128*128                        =   131,328
//   total                                                   1,824,768 (x48 = 87,588,864)
TEST(EvoformerTest, ParameterCountPerBlock) {
  const EvoformerConfig c = Preset("evoformer");
  EXPECT_EQ(EvoformerBlockParameterCount(c), 1824768);
  Program p = Lower(c, 4, 8);
  const Graph& g = Main(p);
  auto tensors = Tensors(g);
  std::map<int, int64_t> per_block;
  int adams = 0, syncs = 0;
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdam) {
      per_block[op.tags.layer] += tensors.at(op.inputs[0])->NumElements();
      ++adams;
    }
    if (op.kind == OpKind::kCollective && op.tags.purpose == "grad_sync") {
      EXPECT_EQ(op.group.axes, (std::vector<std::string>{"dp", "dap"})) << op.name;
      ++syncs;
    }
  }
  ASSERT_EQ(per_block.size(), 49u);  // blocks 0..47 and the heads (layer -1)
  for (const auto& [layer, count] : per_block) {
    if (layer >= 0) {
      EXPECT_EQ(count, 1824768) << layer;
    }
  }
  // Heads: distogram c_z x 64 = 8,192, masked MSA c_m x 23 = 5,888.
  EXPECT_EQ(per_block.at(-1), 14080);
  EXPECT_EQ(EvoformerHeadParameterCount(c), 14080);
  // 66 parameters per block: msa_row 10, msa_col 7, msa_trans 4, opm 5,
  // tri_mul 2x10, tri_att 2x8, pair_trans 4; plus the two head weights; one
  // Adam and one all-reduce each.
  EXPECT_EQ(adams, 66 * 48 + 2);
  EXPECT_EQ(syncs, 66 * 48 + 2);
}

// evoformer-tiny (c_m 16, c_z 8, heads 2x4 everywhere, OPM 4, width 8):
//   msa_row 32+16+4*16*8+8*2+8*16 = 704; msa_col 32+512+128 = 672;
//   msa_trans 32+2*4*16*16 = 2080; opm 32+2*16*4+16*8 = 288;
//   tri_mul 16+4*8*8+16+64+64 = 416 (x2); tri_att 16+256+8*2+64 = 352 (x2);
//   pair_trans 16+2*4*64 = 528; total 5,808. Heads: 8*64 + 16*23 = 880.
TEST(EvoformerTest, TinyParameterCount) {
  EXPECT_EQ(EvoformerBlockParameterCount(Preset("evoformer-tiny")), 5808);
  EXPECT_EQ(EvoformerHeadParameterCount(Preset("evoformer-tiny")), 880);
  Program p = Lower(Preset("evoformer-tiny"), 2, 2);
  auto tensors = Tensors(Main(p));
  int64_t total = 0;
  for (const Op& op : Main(p).ops)
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdam)
      total += tensors.at(op.inputs[0])->NumElements();
  EXPECT_EQ(total, 5808 + 880);
}

/// The op called `name` in `g` (must exist).
const Op& FindOp(const Graph& g, const std::string& name) {
  for (const Op& op : g.ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op " << name;
  static const Op none;
  return none;
}

// The heads and losses of evoformer at dp 4 x dap 8 (bf16), per rank:
// distogram on the pair [256/8, 256, 128]: 32 x 256 = 8,192 pairs,
//   head.distogram          matmul 2*8192*128*64            = 134,217,728 flops
//   mirror (switch)         all-to-all [32, 256, 64] bf16   =   1,048,576 bytes
//   logits                  8192 x 64                       =     524,288 elements
//   loss.distogram.max      1/elem                          =     524,288 flops
//   loss.distogram.sum_exp  3/elem                          =   1,572,864 flops
//   cross_entropy           4/pair, denominator 8,192 (this rank's pairs: a local mean)
//   cross_entropy.grad      4/elem = 2,097,152 flops, denominator 256*256 pairs * 4 dp
//                           = 262,144 (the mean over every rank's pairs), then x 0.3
// masked MSA on the MSA [128/8, 256, 256]: 16 x 256 = 4,096 positions,
//   head.masked_msa         matmul 2*4096*256*23            =  48,234,496 flops
//   cross_entropy           denominator 4,096; grad: 128*256*4 = 131,072, then x 2.0
// No other collectives: both heads act on row-sharded rows; the grad_sync
// all-reduces of the two weights run over {dp, dap}.
TEST(EvoformerTest, HeadsAndLoss) {
  const Program p = Lower(Preset("evoformer"), 4, 8);
  const Graph& g = Main(p);
  EXPECT_DOUBLE_EQ(FindOp(g, "head.distogram").flops, 134217728.0);
  EXPECT_DOUBLE_EQ(FindOp(g, "head.masked_msa").flops, 48234496.0);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.distogram.max").flops, 524288.0);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.distogram.sum_exp").flops, 1572864.0);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.distogram.cross_entropy").flops, 4.0 * 8192);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.distogram.cross_entropy").attrs.at("denominator"), 8192.0);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.distogram.cross_entropy.grad").flops, 2097152.0);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.distogram.cross_entropy.grad").attrs.at("denominator"),
                   262144.0);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.distogram.weight").attrs.at("scale"), 0.3);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.masked_msa.cross_entropy").attrs.at("denominator"), 4096.0);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.masked_msa.cross_entropy.grad").attrs.at("denominator"),
                   131072.0);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.masked_msa.weight").attrs.at("scale"), 2.0);
  EXPECT_EQ(FindOp(g, "head.distogram.mirror.a2a").message_bytes, 1048576);
  EXPECT_EQ(FindOp(g, "head.distogram.mirror.grad.a2a").message_bytes, 1048576);
  auto t = Tensors(g);
  EXPECT_EQ(t.at("evo.distogram.labels")->shape, (std::vector<int64_t>{32, 256}));
  EXPECT_EQ(t.at("evo.distogram.labels")->dtype, DType::kI32);
  EXPECT_EQ(t.at("evo.distogram.labels")->sharding[0], std::vector<std::string>{"dap"});
  EXPECT_EQ(t.at("evo.masked_msa.labels")->shape, (std::vector<int64_t>{16, 256}));
  EXPECT_EQ(t.at("loss.distogram")->shape, std::vector<int64_t>{});
  // The backward starts from the losses: no incoming gradient inputs.
  EXPECT_EQ(t.count("evo.msa.out.grad"), 0u);
  EXPECT_EQ(t.count("evo.pair.out.grad"), 0u);
  int cross_entropies = 0, head_collectives = 0;
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kCrossEntropy)
      ++cross_entropies;
    if (op.kind == OpKind::kCollective && op.tags.layer == -1) {
      ++head_collectives;
      if (op.tags.purpose == "grad_sync")
        EXPECT_EQ(op.group.axes, (std::vector<std::string>{"dp", "dap"})) << op.name;
      else
        EXPECT_EQ(op.collective, CollectiveType::kAllToAll) << op.name;
    }
  }
  EXPECT_EQ(cross_entropies, 2);
  EXPECT_EQ(head_collectives, 2 + 2);  // mirror and its grad; two weight all-reduces
}

// Without dap or dp the heads add no collective; the gradient denominators
// are the one sample's label counts: 16*16 = 256 pairs, 8*16 = 128 MSA
// positions (evoformer-tiny).
TEST(EvoformerTest, TinyHeadsUnsharded) {
  const Program p = Lower(Preset("evoformer-tiny"), 1, 1);
  const Graph& g = Main(p);
  for (const Op& op : g.ops) EXPECT_NE(op.kind, OpKind::kCollective) << op.name;
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.distogram.cross_entropy.grad").attrs.at("denominator"), 256);
  EXPECT_DOUBLE_EQ(FindOp(g, "loss.masked_msa.cross_entropy.grad").attrs.at("denominator"), 128);
}

TEST(EvoformerTest, ShardedShapes) {
  Program p = Lower(Preset("evoformer"), 1, 8);
  auto t = Tensors(Main(p));
  // Row-sharded MSA [128/8, 256, 256] and pair [256/8, 256, 128].
  EXPECT_EQ(t.at("evo.msa")->shape, (std::vector<int64_t>{16, 256, 256}));
  EXPECT_EQ(t.at("evo.msa")->sharding[0], std::vector<std::string>{"dap"});
  EXPECT_EQ(t.at("evo.pair")->shape, (std::vector<int64_t>{32, 256, 128}));
  // Column phase: the MSA transposed, [256/8, 128, 256].
  EXPECT_EQ(t.at("b0.msa.to_col")->shape, (std::vector<int64_t>{32, 128, 256}));
  // The gathered pair bias [8, 256, 256], replicated.
  EXPECT_EQ(t.at("b0.msa_row.bias.ag")->shape, (std::vector<int64_t>{8, 256, 256}));
  EXPECT_TRUE(t.at("b0.msa_row.bias.ag")->sharding[1].empty());
  // Row-attention scores [16, 8, 256, 256].
  EXPECT_EQ(t.at("b0.msa_row.core.scores")->shape, (std::vector<int64_t>{16, 8, 256, 256}));
}

TEST(EvoformerTest, RejectsBadPlans) {
  Result<Program> p = LowerEvoformer(Preset("evoformer"), 1, 3);
  ASSERT_FALSE(p.ok());
  EXPECT_HAS(p.status().message(), "dap (3) must divide n_res (256)");
  EvoformerConfig c = Preset("evoformer");
  c.n_seq = 100;
  p = LowerEvoformer(c, 1, 8);
  ASSERT_FALSE(p.ok());
  EXPECT_HAS(p.status().message(), "dap (8) must divide n_seq (100)");
  p = LowerEvoformer(Preset("evoformer"), 0, 1);
  ASSERT_FALSE(p.ok());
  EXPECT_HAS(p.status().message(), "dp must be >= 1");
  c = Preset("evoformer-tiny");
  c.batch = 2;
  p = LowerEvoformer(c, 1, 1);
  ASSERT_FALSE(p.ok());
  EXPECT_HAS(p.status().message(), "batch must be 1");
  c = Preset("evoformer-tiny");
  c.distogram_weight = 0;
  p = LowerEvoformer(c, 1, 1);
  ASSERT_FALSE(p.ok());
  EXPECT_HAS(p.status().message(), "loss weights must be positive");
  c = Preset("evoformer-tiny");
  c.msa_classes = 0;
  p = LowerEvoformer(c, 1, 1);
  ASSERT_FALSE(p.ok());
  EXPECT_HAS(p.status().message(), "msa_classes must be positive");
  c = Preset("evoformer-tiny");
  c.c_z = 0;
  p = LowerEvoformer(c, 1, 1);
  ASSERT_FALSE(p.ok());
  EXPECT_HAS(p.status().message(), "c_z must be positive");
}

/// fifo schedule simulated on an A800 cluster model; must not deadlock.
void FifoSimulates(const Program& p) {
  Result<ClusterSpec> cluster = LoadCluster("a800-4x8");
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  AnalyticCostModel cost(*cluster);
  Result<ScheduledProgram> sp = RunBaseline("fifo", p, cost);
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  Result<Timeline> timeline = Simulate(*sp, cost);
  ASSERT_TRUE(timeline.ok()) << timeline.status().message();
  EXPECT_GT(timeline->makespan_us, 0);
}

TEST(EvoformerTest, FifoScheduleSimulates) {
  FifoSimulates(Lower(Preset("evoformer-tiny"), 2, 4));
  FifoSimulates(Lower(Preset("evoformer"), 4, 8));
}

}  // namespace
}  // namespace concerto
