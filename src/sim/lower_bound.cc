#include "concerto/sim/lower_bound.h"

#include <algorithm>
#include <map>

#include "concerto/ir/graph_index.h"

namespace concerto {

LowerBound ComputeLowerBound(const Program& program, const CostModel& cost, bool control_deps) {
  LowerBound lb;
  for (const auto& role : program.roles) {
    if (role.ranks.empty()) continue;
    Graph data_only;
    if (!control_deps) {
      data_only = program.GraphOf(role);
      for (auto& op : data_only.ops) op.control_deps.clear();
    }
    const Graph& g = control_deps ? program.GraphOf(role) : data_only;
    GraphIndex index = GraphIndex::Build(g);
    PriceContext ctx{g, index, program.mesh, *std::min_element(role.ranks.begin(), role.ranks.end())};
    std::vector<double> dur(g.ops.size());
    std::map<std::string, double> load;
    for (size_t i = 0; i < g.ops.size(); ++i) {
      dur[i] = cost.Price(g.ops[i], ctx).duration_us;
      load[g.ops[i].stream] += dur[i];
    }
    std::vector<double> finish(g.ops.size(), 0);
    for (int i : TopologicalOrder(g, index)) {
      double start = 0;
      for (int p : index.preds[i]) start = std::max(start, finish[p]);
      finish[i] = start + dur[i];
      lb.critical_path_us = std::max(lb.critical_path_us, finish[i]);
    }
    for (const auto& [stream, us] : load) {
      if (us > lb.stream_load_us) {
        lb.stream_load_us = us;
        lb.busiest_stream = stream;
      }
    }
  }
  lb.lower_bound_us = std::max(lb.critical_path_us, lb.stream_load_us);
  return lb;
}

}  // namespace concerto
