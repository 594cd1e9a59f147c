// fp32 CPU kernels for every compute type of the IR (docs/ir.md section
// 1.6), forward and backward. The runtime stores every tensor as fp32
// whatever its IR dtype (integer ids as exact floats, bf16/f16 computed in
// full fp32); docs/runtime.md lists the kernels and their conventions.
#pragma once

#include <cstdint>
#include <vector>

#include <array>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// A tensor argument of a kernel: its IR description and its fp32 storage
/// (meta->NumElements() floats).
struct KernelArg {
  const Tensor* meta = nullptr;
  float* data = nullptr;
};

/// Buffers kernels keep between calls (embedding_grad's accumulator, the
/// conv kernels' column matrices): owned by whoever runs kernels one after
/// another (an executor's stream, the profiler's timing loop), so a kernel's
/// large buffer is mapped once, not on every call (docs/runtime.md,
/// "Kernels": 24 ms against 4 ms for one embedding gradient).
struct KernelScratch {
  std::array<std::vector<double>, 8> buffers;
};

/// Where the kernel runs: the mesh and the global rank, for the ops whose
/// semantics depend on the rank's shard (embedding, embedding_grad,
/// gather_target, cross_entropy_grad), and the scratch it may reuse (null:
/// the kernel makes its own buffers for this call).
struct KernelContext {
  const Mesh* mesh = nullptr;
  int rank = 0;
  KernelScratch* scratch = nullptr;
};

/// A compute type's fp32 CPU kernel: reads `inputs`, overwrites every
/// element of `outputs`.
using KernelFn = Status (*)(const Op& op, const std::vector<KernelArg>& inputs,
                            const std::vector<KernelArg>& outputs, const KernelContext& ctx);

/// The runtime's facet of an op registry entry (ir/op_registry.h): the
/// kernel and the operand counts it takes (-1: any number; concat's inputs,
/// identity's pairs). Adam's f32 master copy and attention_grad's forward
/// output are optional trailing operands the kernels accept beyond these.
struct CpuKernel {
  ComputeType type;
  int inputs, outputs;
  KernelFn run;
};

/// Every compute type's kernel, in enum order (as OpRegistry(); a test
/// checks that the two tables match).
const std::vector<CpuKernel>& CpuKernels();
/// The kernel of `type`, or null when the runtime has none.
const CpuKernel* FindCpuKernel(ComputeType type);

/// Ok when the runtime can execute compute op `op` with these tensors:
/// a known type, the required attributes present and integral where the IR
/// says so, and argument counts the kernel needs. Runs before anything
/// executes, so an op the runtime cannot run stops the job up front.
Status CheckKernel(const Op& op, const std::vector<const Tensor*>& inputs,
                   const std::vector<const Tensor*>& outputs);

/// Runs compute op `op`: reads `inputs`, overwrites every element of
/// `outputs`. The shapes must satisfy the IR's shape rule (the verifier
/// checks them) and CheckKernel must have accepted the op.
Status RunKernel(const Op& op, const std::vector<KernelArg>& inputs,
                 const std::vector<KernelArg>& outputs, const KernelContext& ctx);

/// The first global index along `dim` that this rank's block of `tensor`
/// holds: block number (docs/ir.md, sharding) times the local size; 0 when
/// the dimension is replicated.
int64_t ShardOffset(const Tensor& tensor, int dim, const Mesh& mesh, int rank);

/// The global (unsharded) shape of `tensor`: each local dimension times the
/// sizes of the mesh axes it is sharded over.
std::vector<int64_t> GlobalShape(const Tensor& tensor, const Mesh& mesh);

/// Sets the number of threads OpenBLAS uses in this process (>= 1).
void SetBlasThreads(int threads);

}  // namespace concerto
